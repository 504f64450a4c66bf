"""What torchrun launches in the distributed tests: train_network.py under a Probe.

    ACCELERATE_USE_CPU=true torchrun --nproc_per_node 2 tests/distributed/launch.py --config x.toml

Arguments are train_network.py's. Environment:
  DIFFTUNE_PROBE             folder for each rank's measurements (rank<R>.json, rank<R>.pt)
  DIFFTUNE_PROBE_HOOK        "1": count gradient buckets through a DDP communication hook
  DIFFTUNE_PROBE_GRADS       "1": also record gradients after every backward and per bucket
  DIFFTUNE_PROBE_INTERRUPT   "k:r": rank r sends itself SIGINT right after optimizer step k
"""

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root

from library.cli import exit_process, main  # noqa: E402
from tests.distributed.probe import probe_from_env  # noqa: E402

if __name__ == "__main__":
    probe, folder = probe_from_env()
    with probe:
        try:
            code = main(sys.argv[1:])
        finally:
            if folder is not None:
                probe.dump(folder, int(os.environ.get("RANK", "0")))
    exit_process(code)
