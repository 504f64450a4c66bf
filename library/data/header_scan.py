"""Reading the headers of a subset's images: one stat and (unless the scan index knows the file)
one open per image, on a pool of threads.

Opening an image waits on the file system (a cold disk, a network share) with the GIL released,
so threads overlap those waits; the header parsing itself is Python and shares one core. Images
go to the threads in chunks, so a million images make a few thousand tasks, not a million.
"""

from __future__ import annotations

import os
import stat
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from library.data.images import ImageHeader, read_image_header
from library.data.scan_index import ScanIndex
from library.errors import DataError

SCAN_THREADS = 8
_CHUNK = 256


def _header(path: Path, index: ScanIndex | None, folder: Path) -> ImageHeader | DataError:
    try:
        info = os.stat(path)
    except OSError:  # missing, a broken link: read_image_header names the problem
        info = None
    try:
        if info is None:
            return read_image_header(path)
        if index is None or not stat.S_ISREG(info.st_mode):
            return read_image_header(path, info.st_mode)
        key = name_in(path, folder) or str(path)
        return index.header(key, info, lambda: read_image_header(path, info.st_mode))
    except DataError as error:
        return error


def name_in(path: Path, folder: Path) -> str | None:
    """The name of ``path`` when it is directly in ``folder`` as written, else None (strings
    compared: no Path is made)."""
    text, prefix = str(path), str(folder)
    if prefix == ".":  # Path(".") / name is written "name"
        return None if os.sep in text else text
    if prefix != os.sep:
        prefix += os.sep
    if text.startswith(prefix) and os.sep not in text[len(prefix) :]:
        return text[len(prefix) :]
    return None


def read_headers(
    paths: list[Path], index: ScanIndex | None, folder: Path
) -> list[ImageHeader | DataError]:
    """The header of each image in `paths`, in order, or the DataError that reading it raised.
    ``index``: the subset's scan index (None: read every file); ``folder``: the subset's folder,
    under which the index knows its images by name."""

    def chunk(start: int) -> list[ImageHeader | DataError]:
        return [_header(path, index, folder) for path in paths[start : start + _CHUNK]]

    starts = range(0, len(paths), _CHUNK)
    if len(starts) <= 1:
        return [header for start in starts for header in chunk(start)]
    with ThreadPoolExecutor(SCAN_THREADS, thread_name_prefix="difftune-scan") as pool:
        return [header for part in pool.map(chunk, starts) for header in part]
