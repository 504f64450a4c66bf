"""What torchrun launches in the distributed data-break tests: train_network.py, with one image
damaged while the run trains.

    torchrun --nproc_per_node 2 tests/distributed/break_image.py --break_image IMG:STEP --config x.toml

``--break_image IMG:STEP`` (taken off the arguments; the rest are train_network.py's): process 0
cuts the file IMG short after optimizer step STEP, or, with STEP 0, after every process has
scanned the data and before the first step. Every process sees the same file system.
"""

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root

from library.cli import exit_process, main  # noqa: E402
from library.sampling.runner import SampleRunner  # noqa: E402
from library.training.saver import Saver  # noqa: E402


def damage(path: Path) -> None:
    path.write_bytes(path.read_bytes()[:40])  # a PNG's signature and part of its header


def break_after(path: Path, step: int) -> None:
    """Patch the run so that process 0 damages ``path`` after optimizer step ``step``."""
    if os.environ.get("RANK", "0") != "0":
        return
    if step == 0:  # the loop starts after a collective that follows every process's scan
        original_start = SampleRunner.at_start

        def at_start(self, global_step):
            damage(path)
            original_start(self, global_step)

        SampleRunner.at_start = at_start
        return
    original_step = Saver.after_step

    def after_step(self, global_step):
        original_step(self, global_step)
        if global_step == step:
            damage(path)

    Saver.after_step = after_step


if __name__ == "__main__":
    args = sys.argv[1:]
    at = args.index("--break_image")
    image, step = args[at + 1].rsplit(":", 1)
    del args[at : at + 2]
    break_after(Path(image), int(step))
    exit_process(main(args))
