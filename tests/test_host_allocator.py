"""keep_freed_host_memory: memory a step frees is reused by the next without new page faults."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from library.host_allocator import USER_SETTINGS, keep_freed_host_memory

# Allocates and frees 400 MiB in 8 MiB blocks five times, like a training step's activations;
# prints the minor page faults of the last four rounds.
CHILD = """
import ctypes, resource, sys
sys.path.insert(0, {repo!r})
if sys.argv[1] == "tuned":
    from library.host_allocator import keep_freed_host_memory
    assert keep_freed_host_memory()
libc = ctypes.CDLL(None)
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = (ctypes.c_void_p,)
def round_():
    blocks = [libc.malloc(8 << 20) for _ in range(50)]
    for b in blocks:
        ctypes.memset(b, 1, 8 << 20)  # touch every page, as a tensor's writes do
    for b in blocks:
        libc.free(b)
round_()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(4):
    round_()
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def _faults(mode: str) -> int:
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = {k: v for k, v in os.environ.items() if k not in USER_SETTINGS and k != "LD_PRELOAD"}
    out = subprocess.run([sys.executable, "-c", CHILD.format(repo=repo), mode], env=env,
                         check=True, capture_output=True, text=True, timeout=120)  # fmt: skip
    return int(out.stdout.strip())


@pytest.mark.subprocess
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's allocator")
def test_freed_memory_is_reused_without_page_faults():
    pages = 4 * 400 * 2**20 // os.sysconf("SC_PAGE_SIZE")  # pages the four rounds write
    default, tuned = _faults("default"), _faults("tuned")
    # glibc's defaults unmap each 8 MiB block when it is freed: every page faults again
    assert default > pages // 2, (default, tuned, pages)
    assert tuned < pages // 100, (default, tuned, pages)


def test_user_settings_are_left_alone(monkeypatch):
    monkeypatch.setenv("MALLOC_TRIM_THRESHOLD_", "1000000")
    assert keep_freed_host_memory() is False
    monkeypatch.delenv("MALLOC_TRIM_THRESHOLD_")
    monkeypatch.setenv("LD_PRELOAD", "/usr/lib/libjemalloc.so.2")
    assert keep_freed_host_memory() is False
    monkeypatch.delenv("LD_PRELOAD")
    monkeypatch.setenv("GLIBC_TUNABLES", "glibc.malloc.mmap_threshold=65536")
    assert keep_freed_host_memory() is False
