"""Reading many image headers in parts: one part in the scanning process (on its threads), the
others in worker processes, so that a first scan of a large dataset uses every core.

Decisions:
- Reading a header is mostly Python (Pillow's parsers, the structure check), so threads share one
  core; processes do not. Below PARALLEL_HEADERS headers to read no process is started: small
  datasets, reruns (the scan index answers) and the tests pay nothing.
- A worker is ``python -I`` running this module's `work`: a fresh interpreter (no CUDA, no
  threads of the parent, safe in any process) that imports only this module and
  library.data.header_read (Pillow and numpy, no torch: a fraction of a second). It reads its paths and stat modes from stdin and writes, per
  image, (width, height, frames) or the message of the DataError reading it raised (marshal).
- The parts are strided shares of the images to read, so each has a like share of any slow
  corner of the dataset; results are put back in order, and the scan index records what the
  workers read as it records the scanning process's reads.
- A worker that fails (cannot start, dies, writes something else) costs time, not results: its
  part is read again in this process, where any error is the one a serial scan raises.
"""

from __future__ import annotations

import marshal
import os
import subprocess
import sys
from pathlib import Path

from library.data.header_read import read_image_header
from library.errors import DataError

# A first scan reading at least this many headers reads them in parts (a PNG header and its
# structure check take some 40 us: 20,000 are close to a second of one core, a worker's start a
# few tenths).
PARALLEL_HEADERS = 20_000
_MAX_WORKERS = 8
_REPOSITORY = str(Path(__file__).resolve().parents[2])  # what a worker imports library from
_WORK = "import sys; sys.path.insert(0, sys.argv[1]); from library.data.header_workers import work; work()"


def parts(count: int) -> int:
    """How many parts ``count`` headers are read in (1: no worker)."""
    if count < PARALLEL_HEADERS:
        return 1
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return max(1, min(cores or 1, _MAX_WORKERS, count // (PARALLEL_HEADERS // 2)))


def start(paths: list[str], modes: list[int | None]) -> subprocess.Popen | None:
    """A worker reading the headers of ``paths`` (``modes``: their st_mode, None: no stat), or
    None when it cannot start."""
    try:
        worker = subprocess.Popen(
            [sys.executable, "-I", "-c", _WORK, _REPOSITORY],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
        )  # fmt: skip
    except OSError:
        return None
    try:
        worker.stdin.write(marshal.dumps((paths, modes)))
        worker.stdin.close()
    except OSError:  # it died: its part is read here
        worker.kill()
        worker.wait()
        return None
    return worker


def finish(worker: subprocess.Popen | None, count: int) -> list | None:
    """What ``worker`` read of its ``count`` images: per image (width, height, frames) or a
    DataError's message; None when it failed."""
    if worker is None:
        return None
    output = worker.stdout.read()
    worker.stdout.close()
    if worker.wait() != 0:
        return None
    try:
        read = marshal.loads(output)
    except (ValueError, TypeError, EOFError):
        return None
    return read if isinstance(read, list) and len(read) == count else None


def work() -> None:
    """A worker's part: the paths and modes on stdin, what was read on stdout (marshal)."""
    paths, modes = marshal.loads(sys.stdin.buffer.read())
    read = []
    for path, mode in zip(paths, modes, strict=True):
        try:
            header = read_image_header(Path(path), mode)
        except DataError as error:
            read.append(str(error))
        else:
            read.append((*header.size, header.frames))
    sys.stdout.buffer.write(marshal.dumps(read))
