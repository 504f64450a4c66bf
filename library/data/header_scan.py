"""Reading the headers of a subset's images: one stat and (unless the scan index knows the file)
one open per image, the opens on a pool of threads.

Opening an image waits on the file system (a cold disk, a network share) with the GIL released,
so threads overlap those waits; the header parsing itself is Python and shares one core. Images
go to the threads in chunks, so a million images make a few thousand tasks, not a million.
"""

from __future__ import annotations

import os
from array import array
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from stat import S_ISREG

from library.data import header_workers
from library.data.folders import Found, images_found
from library.data.images import ImageHeader, read_image_header
from library.data.listing import NO_STAT, stat_fields
from library.data.scan_index import ScanIndex
from library.errors import DataError

SCAN_THREADS = 8
_CHUNK = 256


def _read(
    path: Path | str, fields: tuple[int, ...] | None, index: ScanIndex | None, key: str
) -> ImageHeader | DataError:
    """The header of the image at ``path`` (``fields``: its stat_fields, None: it has no stat),
    kept in the index when it is a regular file."""
    try:
        if fields is None:  # missing, a broken link: read_image_header names the problem
            return read_image_header(path)
        header = read_image_header(path, fields[0])
    except DataError as error:  # never indexed: found again on every run
        return error
    if index is not None and S_ISREG(fields[0]):
        index.record(key, fields[1:], header)
    return header


def path_prefix(folder: Path) -> str:
    """What the text of ``folder / name`` is for a file name ``name``: this + name (Path writes
    Path(".") / name as "name" and Path("/") / name as "/name")."""
    return str(folder / "_")[:-1]


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


def look_up(paths: Sequence[Path], index: ScanIndex | None, keys: list[str]) -> list[Found]:
    """What a stat of each image of ``paths`` and the scan ``index`` (None: none) say of it
    (Found; the index knows the images by ``keys``): what a folder's listing finds itself."""
    stats = array("q")
    for path in paths:
        try:
            stats.extend(stat_fields(os.stat(path)))
        except OSError:
            stats.extend(NO_STAT)
    return images_found(keys, stats, index)


def read_headers(
    found: list[Found],
    path_of: Callable[[int], Path | str],
    index: ScanIndex | None,
    keys: Sequence[str],
) -> list[ImageHeader | DataError]:
    """The header of each image, in order, or the DataError that reading it raised. ``found``:
    what a stat and the scan ``index`` (None: none) gave for each (look_up, or a folder's
    listing); the images it has no header of are opened, on the threads (path_of(i): the
    path of the i-th), many of them in parts on worker processes too (header_workers), and
    recorded in the index by their ``keys``."""
    headers: list[ImageHeader | DataError] = list(found)
    missing = [i for i, known in enumerate(found) if not isinstance(known, ImageHeader)]

    def here(numbers: list[int]) -> None:
        share = [missing[n] for n in numbers]

        def chunk(start: int) -> list[ImageHeader | DataError]:
            return [
                _read(path_of(i), found[i], index, keys[i]) for i in share[start : start + _CHUNK]
            ]

        starts = range(0, len(share), _CHUNK)
        if len(starts) <= 1:
            read = [header for start in starts for header in chunk(start)]
        else:
            with ThreadPoolExecutor(SCAN_THREADS, thread_name_prefix="difftune-scan") as pool:
                read = [header for part in pool.map(chunk, starts) for header in part]
        for i, header in zip(share, read, strict=True):
            headers[i] = header

    def taken(n: int, read: header_workers.Read) -> None:
        i = missing[n]
        error = header_workers.as_error(read)
        if error is not None:
            headers[i] = error
            return
        header = headers[i] = ImageHeader((read[0], read[1]), read[2])
        fields = found[i]
        if index is not None and fields is not None and S_ISREG(fields[0]):
            index.record(keys[i], fields[1:], header)

    def mode_of(n: int) -> int | None:
        fields = found[missing[n]]
        return None if fields is None else fields[0]

    header_workers.read_in_parts(
        "headers", len(missing), lambda n: str(path_of(missing[n])), mode_of, here, taken
    )
    return headers
