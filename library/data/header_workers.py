"""Reading many image headers or caption files in parts: one part in the scanning process, the
others in worker processes, so that a first scan of a large dataset uses every core.

Decisions:
- Reading a header is mostly Python (Pillow's parsers, the structure check), so threads share one
  core; processes do not. A caption file is less work but a few system calls (more waiting on a
  cold disk), which the workers overlap too. Below PARALLEL_READS files to read no process is
  started: small datasets, reruns (the scan index answers) and the tests pay nothing.
- A worker is ``python -I`` running this module's `work`: a fresh interpreter (no CUDA, no
  threads of the parent, safe in any process) that imports only this module,
  library.data.header_read, library.data.caption_files and library.data.prefetch (Pillow and
  numpy, no torch: a fraction of a second). It reads the kind of file and its part's paths
  (and the images' stat modes) from stdin and writes, per file, what was read (an image's
  (width, height, frames), a caption file's lines) or, as a 1-tuple, the message of the
  DataError reading it raised (marshal).
- Two parts per core (at most 8): a worker reads one file at a time, and a first scan often finds
  its files out of the page cache, so more parts than cores keep more reads waiting on the disk
  at once (this process's part reads on threads), and each part's files are asked of the
  kernel ahead of its reader (library.data.prefetch), which keeps far more reads waiting. Where
  the files are cached the extra workers cost their start, a few tenths of a second of CPU.
- The parts are strided shares of the files to read, so each has a like share of any slow
  corner of the dataset; results are put back in order, and the caller records what the
  workers read (in the scan index) as it records its own reads.
- A worker that fails (cannot start, dies, writes something else) costs time, not results: its
  part is read again in this process, where any error is the one a serial scan raises.
"""

from __future__ import annotations

import marshal
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from library.data.caption_files import caption_lines
from library.data.header_read import read_image_header
from library.data.listing import finish_worker, start_worker
from library.data.prefetch import Prefetch
from library.errors import DataError

# A first scan reading at least this many files of a kind reads them in parts (a PNG header and
# its structure check take some 40 us, a caption file some 15: 20,000 are a few tenths of a
# second of one core or more, about what a worker's start costs).
PARALLEL_READS = 20_000
_MAX_WORKERS = 8
PARTS_PER_CORE = 2  # more parts than cores: reads waiting on the disk overlap (module docstring)
# this process's part is read in chunks (8 of the threads' 256 files), its prefetch told per
# chunk: half its window, so the next chunk is asked for while one is read
_HERE_CHUNK = 2048
_WORK_CHUNK = 256  # a worker tells its prefetch per this many files read
_REPOSITORY = str(Path(__file__).resolve().parents[2])  # what a worker imports library from
_WORK = "import sys; sys.path.insert(0, sys.argv[1]); from library.data.header_workers import work; work()"

# What a worker returns for one file: what was read, or (message,) for a DataError
Read = tuple[int, int, int] | str | tuple[str]


def parts(count: int) -> int:
    """How many parts ``count`` files are read in (1: no worker)."""
    if count < PARALLEL_READS:
        return 1
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return max(1, min((cores or 1) * PARTS_PER_CORE, _MAX_WORKERS, count // (PARALLEL_READS // 2)))


def _start(kind: str, paths: list[str], modes: list[int | None]) -> subprocess.Popen | None:
    return start_worker([sys.executable, "-I", "-c", _WORK, _REPOSITORY], (kind, paths, modes))


def _finish(worker: subprocess.Popen | None, count: int) -> list[Read] | None:
    read = finish_worker(worker)
    return read if isinstance(read, list) and len(read) == count else None


def read_in_parts(
    kind: str,
    count: int,
    path_of: Callable[[int], str],
    mode_of: Callable[[int], int | None],
    here: Callable[[list[int]], None],
    taken: Callable[[int, Read], None],
) -> None:
    """Read ``count`` files of ``kind`` ("headers" or "captions"): ``here(numbers)`` reads the
    files of those numbers in this process; the other parts (path_of(i), mode_of(i): the i-th
    file's path and st_mode) go to workers, and ``taken(i, read)`` gets what one read (Read)."""
    count_parts = parts(count)
    shares = [list(range(i, count, count_parts)) for i in range(count_parts)]
    workers = [
        (share, _start(kind, [path_of(i) for i in share], [mode_of(i) for i in share]))
        for share in shares[1:]
    ]
    _here_ahead(shares[0], path_of, here, count_parts > 1)
    for share, worker in workers:
        read = _finish(worker, len(share))
        if read is None:  # it failed: its part is read here
            here(share)
            continue
        for i, value in zip(share, read, strict=True):
            taken(i, value)


def _here_ahead(
    share: list[int], path_of: Callable[[int], str], here: Callable[[list[int]], None],
    prefetch: bool,
) -> None:  # fmt: skip
    """``here(share)``; with ``prefetch``, in chunks, the files read ahead of it (prefetch.py)."""
    if not prefetch:
        here(share)
        return
    with Prefetch([path_of(i) for i in share]) as ahead:
        for start in range(0, len(share), _HERE_CHUNK):
            chunk = share[start : start + _HERE_CHUNK]
            here(chunk)
            ahead.advance(len(chunk))


def as_error(read: Read) -> DataError | None:
    """The DataError a worker's read stands for, None for a good read."""
    return DataError(read[0]) if isinstance(read, tuple) and len(read) == 1 else None


def work() -> None:
    """A worker's part: the kind, paths and modes on stdin, what was read on stdout."""
    kind, paths, modes = marshal.loads(sys.stdin.buffer.read())
    read: list[Read] = []
    with Prefetch(paths) as ahead:
        for n, (path, mode) in enumerate(zip(paths, modes, strict=True), 1):
            try:
                if kind == "headers":
                    header = read_image_header(path, mode)
                    read.append((*header.size, header.frames))
                else:
                    read.append(caption_lines(path))
            except DataError as error:
                read.append((str(error),))
            if n % _WORK_CHUNK == 0:  # told in chunks: a wake of its thread per file costs more
                ahead.advance(_WORK_CHUNK)
    sys.stdout.buffer.write(marshal.dumps(read))
