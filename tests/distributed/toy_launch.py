"""What torchrun launches for runs of the made-up Toy family (tests/kits/toy/): the CLI with Toy
registered, as a real family's registry line would have it.

    ACCELERATE_USE_CPU=true torchrun --nproc_per_node 2 tests/distributed/toy_launch.py --config x.toml
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root

from library.cli import exit_process, main  # noqa: E402
from library.models.families import registry  # noqa: E402
from tests.kits.toy.entry import TOY_ENTRY  # noqa: E402

if __name__ == "__main__":
    with registry.registered(TOY_ENTRY):
        code = main(sys.argv[1:])
    exit_process(code)
