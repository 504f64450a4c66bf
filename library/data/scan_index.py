"""The scan index: what the last scan of a subset read from its image headers and caption files,
so a later run over an unchanged dataset reads one file instead of every header.

Decisions:
- An entry is trusted only while its file is the same file: same path, size, modification time
  (ns), change time (ns) and inode (the times and inode as their low 63 bits), all from one
  stat the scan makes anyway. Editing, replacing
  (a new file under the old name, even of the same size and with the old mtime restored: its
  change time and usually its inode differ), adding or removing a file is seen, and only that
  file is read again. Nothing else of the file is trusted: its type and path problems are checked
  from the same stat on every run.
- Only what a good file gave is kept: an image's displayed size and frame count, a video file's
  probe (as the JSON values library.data.clips makes of it: a probe decodes every frame, the
  costliest read of a scan), a caption file's text (every non-empty line). An unreadable image or a bad caption file is not indexed,
  so its error is found again on every run.
- The file starts with a header line (format, version, checksum of the rest); the rest is JSON
  whose numbers (the identities, an image's header as a number in a table of the distinct
  headers) are packed little-endian arrays in base64. A rerun compares a folder's stats with
  them all at once (numpy), not file by file in Python: a million files' entries are read and
  checked in about a second. A file that is
  truncated, overwritten, of another version or otherwise not an index is ignored with one
  warning and written anew; the scan then reads every file, so a damaged index costs time, never
  a wrong size or caption.
- It is written (atomically) only when something changed, so a rerun over an unchanged dataset
  writes nothing. It holds the entries of the files the scan met this run: removed files drop
  out.
- Where it lives: library.data.items.scan_index_path (beside the latent cache).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import logging
import os
from array import array
from itertools import repeat
from pathlib import Path
from stat import S_IFREG

import numpy as np

from library.data.images import ImageHeader
from library.saving.atomic import SaveError, atomic_write_file, remove_stale_temporaries

log = logging.getLogger(__name__)

FORMAT = "difftune scan index"
VERSION = 2
# What a stat says of a file that must not change for its entry to be trusted: size, mtime_ns,
# ctime_ns and inode, the last three as their low 63 bits (a time before 1970 is negative, a
# Windows file id may have 128 bits): every field fits a signed 64-bit number.
Identity = tuple[int, int, int, int]
_LOW_BITS = (1 << 63) - 1
_PACKED = np.dtype("<i8")  # how the file holds its numbers
_FILE_TYPE = 0o170000  # the bits of st_mode that say a file's type (stat.S_IFMT)


def identity(info: os.stat_result) -> Identity:
    """The identity of a stat result."""
    return (
        info.st_size,
        info.st_mtime_ns & _LOW_BITS,
        info.st_ctime_ns & _LOW_BITS,
        info.st_ino & _LOW_BITS,
    )


class IndexDamaged(ValueError):
    """The index file cannot be used; the message says why."""


def _unpacked(text: object, count: int, what: str) -> np.ndarray:
    """The ``count`` numbers packed in base64 ``text``."""
    if not isinstance(text, str):
        raise IndexDamaged(f"{what} are not packed numbers")
    try:
        data = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise IndexDamaged(f"{what} are not base64") from None
    if len(data) != count * _PACKED.itemsize:
        raise IndexDamaged(f"{what} differ in length from the names")
    return np.frombuffer(data, _PACKED).astype(np.int64, copy=False)


def _packed(numbers: np.ndarray) -> str:
    return base64.b64encode(np.ascontiguousarray(numbers, _PACKED).tobytes()).decode("ascii")


class _Table:
    """One kind of entry of an index file, as read: its names (in name order, as written), per
    row the file's identity (an [N, 4] array) and what was read from it (no object per entry
    until one is asked for)."""

    def __init__(self, names: list, identities: np.ndarray, values: list) -> None:
        self.names, self.identities, self.values = names, identities, values
        self._rows: dict[str, int] | None = None
        self.compared_in_order = False  # a listing equal to the names (which are in name order)

    @property
    def rows(self) -> dict[str, int]:
        """name -> row; made when a listing differs from the names (a million names take half
        a second), not for a rerun over an unchanged folder."""
        if self._rows is None:
            self._rows = dict(zip(self.names, range(len(self.names)), strict=True))
        return self._rows

    def unchanged(self, names: list[str], stats: array) -> np.ndarray:
        """The row of each of ``names`` (-1 where none) whose file is a regular file and the
        same file as its entry's, from the listing's ``stats`` (five numbers per name:
        NO_STAT's)."""
        count = len(names)
        if not self.names or not count:
            return np.full(count, -1, np.int64)
        if names == self.names:  # an unchanged folder's listing, in name order: row i is name i
            rows = np.arange(count, dtype=np.int64)
            self.compared_in_order = True
        else:
            rows = np.fromiter(map(self.rows.get, names, repeat(-1)), np.int64, count)
        fields = np.frombuffer(stats, np.int64).reshape(count, 5)
        listed = rows >= 0
        same = self.identities[np.where(listed, rows, 0)] == fields[:, 1:]
        regular = (fields[:, 0] & _FILE_TYPE) == S_IFREG
        return np.where(listed & regular & same.all(axis=1), rows, -1)

    def row(self, key: str, info: os.stat_result) -> int | None:
        """The row of ``key`` when its file's identity is that of the stat ``info``, else
        None (one file: `unchanged` checks a listing's)."""
        i = self.rows.get(key)
        if i is None or tuple(self.identities[i].tolist()) != identity(info):
            return None
        return i


_EMPTY = _Table([], np.zeros((0, 4), np.int64), [])


def _table(body: dict, kind: str) -> _Table:
    part = body.get(kind)
    if not isinstance(part, dict) or not isinstance(part.get("names"), list):
        raise IndexDamaged(f"no {kind}")
    names, values = part["names"], part.get("values")
    if not all(map(str.__instancecheck__, names)):  # the name-order check compares them
        raise IndexDamaged(f"{kind} names are not all text")
    count = len(names)
    identities = _unpacked(part.get("identities"), 4 * count, f"{kind} identities")
    if kind == "images":
        values = _header_values(part, values, count)
    elif not isinstance(values, list) or len(values) != count:
        raise IndexDamaged(f"{kind} values differ in length from the names")
    return _Table(names, identities.reshape(count, 4), values)


def _header_values(part: dict, codes: object, count: int) -> list[ImageHeader]:
    """Each image's header (one shared object per distinct header) from the table of distinct
    headers and each image's number in it."""
    distinct = part.get("headers")
    if not isinstance(distinct, list) or not all(
        isinstance(h, list) and len(h) == 3 and all(type(n) is int for n in h) for h in distinct
    ):
        raise IndexDamaged("images headers are not [width, height, frames]")
    numbers = _unpacked(codes, count, "images values")
    if count and not 0 <= numbers.min() <= numbers.max() < len(distinct):
        raise IndexDamaged("an image's header is not in the table")
    headers = [ImageHeader((width, height), frames) for width, height, frames in distinct]
    return list(map(headers.__getitem__, numbers.tolist()))


def _parse(data: bytes) -> tuple[_Table, _Table, _Table]:
    """(images, captions, videos) of an index file's bytes."""
    head, newline, body = data.partition(b"\n")
    try:
        header = json.loads(head)
    except ValueError:
        raise IndexDamaged("no header line") from None
    if not isinstance(header, dict) or header.get("format") != FORMAT:
        raise IndexDamaged("not a scan index")
    if header.get("version") != VERSION:
        raise IndexDamaged(f"version {header.get('version')}, this difftune writes {VERSION}")
    if not newline or hashlib.blake2b(body, digest_size=16).hexdigest() != header.get("checksum"):
        raise IndexDamaged("checksum mismatch: truncated or overwritten")
    try:
        parsed = json.loads(body)
    except ValueError:
        raise IndexDamaged("body is not JSON") from None
    if not isinstance(parsed, dict):
        raise IndexDamaged("body is not an object")
    return _table(parsed, "images"), _table(parsed, "captions"), _table(parsed, "videos")


class _Met:
    """What a scan met of one kind of entry: the rows of the file that answered (marked, and
    counted), and the entries read anew (name -> (identity, value))."""

    def __init__(self, table: _Table) -> None:
        self.table = table
        self.kept = np.zeros(len(table.names), bool)
        self.answers = 0
        self.new: dict[str, tuple[Identity, object]] = {}

    def answered(self, rows: np.ndarray) -> list:
        """The value of each row of ``rows`` (None where -1), kept for the next index."""
        found = rows[rows >= 0]
        self.kept[found] = True
        self.answers += len(found)
        values = self.table.values
        if len(found) == len(rows):  # every file answered: no test per row
            return list(map(values.__getitem__, rows.tolist()))
        return [values[row] if row >= 0 else None for row in rows.tolist()]

    def unchanged(self) -> bool:
        """Whether the entries met are the file's, all of them, each once, and the file holds
        them in name order (one that does not, an older difftune's, is written again in name
        order: then a rerun's listing equals its names)."""
        if self.new or self.answers != len(self.kept) or not self.kept.all():
            return False
        names = self.table.names
        return self.table.compared_in_order or all(map(str.__le__, names, names[1:]))

    def columns(self) -> dict:
        """The entries met as the file holds them, in name order."""
        table = self.table
        kept = np.flatnonzero(self.kept).tolist()
        names = [table.names[i] for i in kept] + list(self.new)
        values = [table.values[i] for i in kept] + [v for _, v in self.new.values()]
        identities = table.identities[kept]
        if self.new:
            new = np.array([ident for ident, _ in self.new.values()], np.int64).reshape(-1, 4)
            identities = np.concatenate([identities, new])
        order = sorted(range(len(names)), key=names.__getitem__)
        return {
            "names": [names[i] for i in order],
            "identities": _packed(identities[order]),
            "values": [values[i] for i in order],
        }


def _image_columns(met: _Met) -> dict:
    """The images met, their headers as numbers in a table of the distinct headers."""
    columns = met.columns()
    numbers: dict[ImageHeader, int] = {}
    codes = [numbers.setdefault(header, len(numbers)) for header in columns["values"]]
    columns["values"] = _packed(np.array(codes, np.int64))
    columns["headers"] = [[*header.size, header.frames] for header in numbers]
    return columns


class ScanIndex:
    """One subset's index file, read when opened; `known_images` and `known_captions` answer
    from it for the files of a listing that did not change, `record` and `record_caption` keep
    what was read otherwise, and `save` writes what this scan met. Safe to call from several
    threads (each call adds one list or dict item)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.damaged: str | None = None
        self._images, self._captions, self._videos = self._load(path)

    @property
    def reused(self) -> int:
        """Image headers and video probes answered from the index."""
        return self._images.answers + self._videos.answers

    def _load(self, path: Path) -> tuple[_Met, _Met, _Met]:
        tables = (_EMPTY, _EMPTY, _EMPTY)
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            pass
        except OSError as error:
            self.damaged = error.strerror or str(error)
        else:
            try:
                tables = _parse(data)
            except (IndexDamaged, TypeError, IndexError, ValueError) as error:
                self.damaged = str(error) or type(error).__name__
        if self.damaged is not None:
            log.warning(
                "scan index %s cannot be used (%s); the images are read again and it is rebuilt",
                path,
                self.damaged,
            )
        return tuple(_Met(table) for table in tables)

    def known_images(self, keys: list[str], stats: array) -> list[ImageHeader | None]:
        """The indexed header of each image of ``keys`` whose file is unchanged (and kept for
        the next index), else None: the caller reads it and calls `record`. ``stats``: five
        numbers per image (stat_fields, NO_STAT)."""
        met = self._images
        return met.answered(met.table.unchanged(keys, stats))

    def record(self, key: str, ident: Identity, header: ImageHeader) -> None:
        """Keep the header read from the image `key` whose identity is `ident`."""
        self._images.new[key] = (ident, header)

    def known_captions(self, keys: list[str], stats: array) -> list[str | None]:
        """The indexed text of each caption file of ``keys`` that is unchanged (and kept for
        the next index), else None: the caller reads it and calls `record_caption`."""
        met = self._captions
        return met.answered(met.table.unchanged(keys, stats))

    def known_caption(self, key: str, info: os.stat_result) -> str | None:
        """`known_captions` of one file, by its stat."""
        met = self._captions
        i = met.table.row(key, info)
        return None if i is None else met.answered(np.array([i], np.int64))[0]

    def record_caption(self, key: str, ident: Identity, text: str) -> None:
        """Keep the text read from the caption file `key` whose identity is `ident`."""
        self._captions.new[key] = (ident, text)

    def known_video(self, key: str, info: os.stat_result) -> object | None:
        """The indexed probe (JSON values) of the video file `key` whose stat is `info` when
        the file is unchanged, else None: the caller probes it and calls `record_video`. The
        caller checks the values and calls `keep_video` for the ones it uses."""
        table = self._videos.table
        i = table.row(key, info)
        return None if i is None else table.values[i]

    def keep_video(self, key: str, info: os.stat_result, values: object) -> None:
        """Keep an indexed probe that answered (counted as reused) for the next index."""
        self._videos.answered(np.array([self._videos.table.rows[key]], np.int64))

    def record_video(self, key: str, info: os.stat_result, values: object) -> None:
        """Keep the probe (JSON values) of the video file `key` whose stat is `info` for the
        next index."""
        self._videos.new[key] = (identity(info), values)

    def save(self) -> None:
        """Write the entries this scan met, when they differ from the file's. A folder that
        cannot be written keeps no index (the next run reads the files again)."""
        kinds = (self._images, self._captions, self._videos)
        if self.damaged is None and all(met.unchanged() for met in kinds):
            return
        body = {
            "images": _image_columns(self._images),
            "captions": self._captions.columns(),
            "videos": self._videos.columns(),
        }
        body = json.dumps(body, separators=(",", ":")).encode()
        header = {
            "format": FORMAT,
            "version": VERSION,
            "checksum": hashlib.blake2b(body, digest_size=16).hexdigest(),
        }
        data = json.dumps(header).encode() + b"\n" + body
        # what a killed write of this index left behind (another run's live write is kept)
        remove_stale_temporaries(self.path.parent, lambda output: output == self.path.name)
        try:
            atomic_write_file(self.path, lambda tmp: tmp.write_bytes(data), place="cache_dir")
        except SaveError as error:  # read-only data, full disk: the scan itself is done
            log.info("scan index not kept: %s", error)
