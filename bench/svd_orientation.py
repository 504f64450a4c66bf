"""The SVD ``lora_tool.py extract`` runs, on a wide weight change as it is and as its transpose:
seconds per decomposition and the largest difference between the two results.

    python bench/svd_orientation.py                      # SD-sized layers, float64, 1 thread
    python bench/svd_orientation.py --shapes 3072x12288 --threads 4

Not a test and not timed in CI. torch.linalg.svd's cost depends on the orientation: for
[out, n] with out < n it is about twice that of [n, out]; library/lora_tools/svd.py's
svd_of_matrix decomposes the tall one, and this prints both so the claim can be checked on any
machine. The matrices are random (a weight change's values do not change the cost).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from library.third_party_noise import silence_unactionable_messages  # noqa: E402

silence_unactionable_messages()  # before any import below loads bitsandbytes

import torch  # noqa: E402

from library.lora_tools.svd import svd_of_matrix  # noqa: E402

# [out, in * kh * kw] of wide SD 1.5 layers: a 3x3 conv of the first block, an ff output
SHAPES = ("320x2880", "320x1280", "640x5760")


def _seconds(call, repeats: int) -> float:
    call()  # warm up (LAPACK workspace, threads)
    start = time.perf_counter()
    for _ in range(repeats):
        call()
    return (time.perf_counter() - start) / repeats


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shapes", nargs="+", default=list(SHAPES), help="OUTxIN, out < in")
    parser.add_argument("--repeats", type=int, default=3, help="decompositions per figure")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    generator = torch.Generator().manual_seed(0)
    print(
        f"{'shape':>12} {'as is (s)':>10} {'svd_of_matrix (s)':>18} {'speed-up':>9} {'max diff':>9}"
    )
    for shape in args.shapes:
        rows, cols = (int(n) for n in shape.split("x"))
        matrix = torch.randn(rows, cols, dtype=torch.float64, generator=generator)
        plain = _seconds(lambda m=matrix: torch.linalg.svd(m, full_matrices=False), args.repeats)
        ours = _seconds(lambda m=matrix: svd_of_matrix(m), args.repeats)
        svd = svd_of_matrix(matrix)
        diff = (svd.U * svd.S @ svd.Vh - matrix).abs().max().item()
        print(f"{shape:>12} {plain:>10.3f} {ours:>18.3f} {plain / ours:>8.2f}x {diff:>9.1e}")


if __name__ == "__main__":
    main()
