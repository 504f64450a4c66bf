"""Reading the headers of a subset's images: one stat and (unless the scan index knows the file)
one open per image, the opens on a pool of threads.

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


def _read(
    path: Path, info: os.stat_result | None, index: ScanIndex | None, key: str
) -> ImageHeader | DataError:
    try:
        if info is None:  # missing, a broken link: read_image_header names the problem
            return read_image_header(path)
        header = read_image_header(path, info.st_mode)
    except DataError as error:  # never indexed: found again on every run
        return error
    if index is not None and stat.S_ISREG(info.st_mode):
        index.record(key, info, header)
    return header


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
    paths: list[Path], index: ScanIndex | None, keys: list[str], folder: Path | None = None
) -> list[ImageHeader | DataError]:
    """The header of each image in `paths`, in order, or the DataError that reading it raised.
    ``index``: the subset's scan index (None: read every file), which knows the images by
    ``keys`` (one per path). ``folder``: where every path is ``folder / key`` (a folder subset's
    images, keyed by name).

    Every image is stat'ed here first and what the index answers is taken; only the others are
    opened, on the threads (the answers themselves are too quick to share out)."""
    headers: list[ImageHeader | DataError | None] = []
    missing: list[tuple[int, os.stat_result | None, str]] = []
    # a folder's files are stat'ed by a joined string: formatting a million Paths costs more
    where = paths if folder is None else [os.path.join(folder, "") + key for key in keys]
    for i, (path, key) in enumerate(zip(where, keys, strict=True)):
        try:
            info = os.stat(path)
        except OSError:
            info = None
        header = None
        if index is not None and info is not None and stat.S_ISREG(info.st_mode):
            header = index.known(key, info)
        if header is None:
            missing.append((i, info, key))
        headers.append(header)

    def chunk(start: int) -> list[ImageHeader | DataError]:
        return [
            _read(paths[i], info, index, key) for i, info, key in missing[start : start + _CHUNK]
        ]

    starts = range(0, len(missing), _CHUNK)
    if len(starts) <= 1:
        read = [header for start in starts for header in chunk(start)]
    else:
        with ThreadPoolExecutor(SCAN_THREADS, thread_name_prefix="difftune-scan") as pool:
            read = [header for part in pool.map(chunk, starts) for header in part]
    for (i, _, _), header in zip(missing, read, strict=True):
        headers[i] = header
    return headers
