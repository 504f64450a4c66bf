"""Host-memory allocator settings for training: freed memory is kept for the next step.

A training step on the CPU allocates and frees the same activations every step, hundreds of
megabytes of them. With glibc's default settings most of that memory goes back to the system
when it is freed (the top of the heap is trimmed, large blocks are unmapped) and comes back as
fresh pages at the next step, each of which the kernel must fault in and zero: about 200,000
page faults per step for SD 1.5 at 128 px, 15-20% of the step's time (bench/train_speed.py and
docs/performance.md). Raising glibc's thresholds keeps the memory in the process instead, and
the steps are faster. The kept memory is resident: a step's freed activations stay in the
heap, in another order at each step, so the process holds more than its live tensors. On
full-size SD 1.5 at 512 px the resident peak of a step was 8.27 GiB, 1.9 GiB above the tensors
alive at once and the interpreter (1.9 GiB of activations); with glibc mapping every block of
64 KiB and more on its own it was 6.42 GiB, but every step faulted 3.95 million pages in again
and took half as long again (docs/performance.md). The memory estimate counts the kept memory (library/training/process_memory.py).
GPU runs allocate little on the host; the settings cost them nothing.

Nothing is changed where the user chose allocator settings (any ``MALLOC_*_`` variable of
glibc, a ``glibc.malloc`` tunable in ``GLIBC_TUNABLES``, or ``LD_PRELOAD`` of another allocator
such as jemalloc or tcmalloc), or where the C library is not glibc.
"""

from __future__ import annotations

import ctypes
import os
import sys

# mallopt parameters (glibc's malloc.h)
M_TRIM_THRESHOLD = -1
M_TOP_PAD = -2
M_MMAP_THRESHOLD = -3

MIB = 1 << 20
# Blocks up to this size come from the heap instead of their own mapping (glibc's largest
# allowed threshold on 64-bit systems is 32 MiB).
MMAP_THRESHOLD = 32 * MIB
# Free memory at the top of the heap is returned to the system only beyond this (2 GiB - 1:
# mallopt takes a C int).
TRIM_THRESHOLD = 2**31 - 1
# The heap grows by at least this much at a time; smaller pads measured to leave most of the
# faults in place (docs/performance.md).
TOP_PAD = 512 * MIB
USER_SETTINGS = ("MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_", "MALLOC_MMAP_THRESHOLD_")


def keep_freed_host_memory() -> bool:
    """Apply the settings above to this process; True when they were applied."""
    if not sys.platform.startswith("linux"):
        return False
    if any(name in os.environ for name in USER_SETTINGS) or os.environ.get("LD_PRELOAD"):
        return False
    if "glibc.malloc." in os.environ.get("GLIBC_TUNABLES", ""):  # mallopt would override them
        return False
    try:
        libc = ctypes.CDLL(None)
        libc.gnu_get_libc_version  # noqa: B018 (only glibc has it; musl's mallopt does nothing)
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    settings = ((M_MMAP_THRESHOLD, MMAP_THRESHOLD), (M_TRIM_THRESHOLD, TRIM_THRESHOLD),
                (M_TOP_PAD, TOP_PAD))  # fmt: skip
    return all(mallopt(param, value) == 1 for param, value in settings)
