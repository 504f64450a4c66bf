"""The scan index: what the last scan of a subset read from its image headers and caption files,
so a later run over an unchanged dataset reads one file instead of every header.

Decisions:
- An entry is trusted only while its file is the same file: same path, size, modification time
  (ns), change time (ns) and inode, all from one stat the scan makes anyway. Editing, replacing
  (a new file under the old name, even of the same size and with the old mtime restored: its
  change time and usually its inode differ), adding or removing a file is seen, and only that
  file is read again. Nothing else of the file is trusted: its type and path problems are checked
  from the same stat on every run.
- Only what a good file gave is kept: an image's displayed size and frame count, a video file's
  probe (as the JSON values library.data.clips makes of it: a probe decodes every frame, the
  costliest read of a scan), a caption file's text (every non-empty line). An unreadable image or a bad caption file is not indexed,
  so its error is found again on every run.
- The file starts with a header line (format, version, checksum of the rest). A file that is
  truncated, overwritten, of another version or otherwise not an index is ignored with one
  warning and written anew; the scan then reads every file, so a damaged index costs time, never
  a wrong size or caption.
- It is written (atomically) only when something changed, so a rerun over an unchanged dataset
  writes nothing. It holds the entries of the files the scan met this run: removed files drop
  out.
- Where it lives: library.data.items.scan_index_path (beside the latent cache).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from pathlib import Path

from library.data.images import ImageHeader
from library.saving.atomic import SaveError, atomic_write_file, remove_stale_temporaries

log = logging.getLogger(__name__)

FORMAT = "difftune scan index"
VERSION = 1
# what a stat says of a file that must not change for its entry to be trusted
Identity = tuple[int, int, int, int]


def identity(info: os.stat_result) -> Identity:
    """(size, mtime_ns, ctime_ns, inode) of a stat result."""
    return (info.st_size, info.st_mtime_ns, info.st_ctime_ns, info.st_ino)


class IndexDamaged(ValueError):
    """The index file cannot be used; the message says why."""


def _columns(body: dict, kind: str, width: int) -> tuple[list, list, list]:
    part = body.get(kind)
    if not isinstance(part, dict):
        raise IndexDamaged(f"no {kind}")
    names, numbers, values = part.get("names"), part.get("numbers"), part.get("values")
    if not (isinstance(names, list) and isinstance(numbers, list) and isinstance(values, list)):
        raise IndexDamaged(f"{kind} are not lists")
    if len(numbers) != 4 * len(names) or len(values) != width * len(names):
        raise IndexDamaged(f"{kind} columns differ in length")
    return names, numbers, values


class _Table:
    """One kind of entry of an index file, as read: name -> row, the rows' identities and values
    kept flat as the file has them (no object per entry until one is asked for)."""

    def __init__(self, names: list, numbers: list, values: list, width: int) -> None:
        self.rows = dict(zip(names, range(len(names)), strict=True))
        self.numbers, self.values, self.width = numbers, values, width

    def row(self, key: str, info: os.stat_result) -> int | None:
        """The row of ``key`` when its file's identity is that of the stat ``info``, else None
        (compared field by field: no tuple is made for the millions of unchanged files)."""
        i = self.rows.get(key)
        if i is None:
            return None
        numbers, j = self.numbers, 4 * i
        if (
            numbers[j] != info.st_size
            or numbers[j + 1] != info.st_mtime_ns
            or numbers[j + 2] != info.st_ctime_ns
            or numbers[j + 3] != info.st_ino
        ):
            return None
        return i

    def get(self, key: str, info: os.stat_result) -> list | None:
        """The values of ``key`` when its file's identity is that of the stat ``info``, else
        None."""
        i = self.row(key, info)
        return None if i is None else self.values[self.width * i : self.width * (i + 1)]


_EMPTY = _Table([], [], [], 1)


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
    images, captions = _columns(parsed, "images", 3), _columns(parsed, "captions", 1)
    # an index written before videos were scanned has none
    videos = _columns(parsed, "videos", 1) if "videos" in parsed else ([], [], [])
    return _Table(*images, 3), _Table(*captions, 1), _Table(*videos, 1)


class ScanIndex:
    """One subset's index file, read when opened; `known` and `known_caption` answer from it
    when the file is unchanged, `record` and `record_caption` keep what was read otherwise, and
    `save` writes what this scan met. Safe to call from several threads (each call stores one
    dict item)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._images, self._captions, self._videos = _EMPTY, _EMPTY, _EMPTY
        self.damaged: str | None = None
        self._load(path)
        self._met_images: dict[str, tuple[Identity, ImageHeader]] = {}
        self._met_captions: dict[str, tuple[Identity, str]] = {}
        self._met_videos: dict[str, tuple[Identity, object]] = {}
        self._hits: list[str] = []  # image keys answered from the index
        self._changed = False

    @property
    def reused(self) -> int:
        """Image headers answered from the index."""
        return len(self._hits)

    def _load(self, path: Path) -> None:
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            return
        except OSError as error:
            self.damaged = error.strerror or str(error)
        else:
            try:
                self._images, self._captions, self._videos = _parse(data)
            except (IndexDamaged, TypeError, IndexError, ValueError) as error:
                self.damaged = str(error) or type(error).__name__
        if self.damaged is not None:
            log.warning(
                "scan index %s cannot be used (%s); the images are read again and it is rebuilt",
                path,
                self.damaged,
            )

    def known(self, key: str, info: os.stat_result) -> ImageHeader | None:
        """The indexed header of the image `key` whose stat is `info` when the file is unchanged
        (and kept for the next index), else None: the caller reads it and calls `record`."""
        table = self._images
        i = table.row(key, info)
        if i is None:
            return None
        values, j = table.values, 3 * i
        header = ImageHeader((values[j], values[j + 1]), values[j + 2])
        self._hits.append(key)
        self._met_images[key] = (identity(info), header)
        return header

    def record(self, key: str, info: os.stat_result, header: ImageHeader) -> None:
        """Keep the header read from the image `key` whose stat is `info` for the next index."""
        self._changed = True
        self._met_images[key] = (identity(info), header)

    def known_video(self, key: str, info: os.stat_result) -> object | None:
        """The indexed probe (JSON values) of the video file `key` whose stat is `info` when
        the file is unchanged, else None: the caller probes it and calls `record_video`. The
        caller checks the values and calls `keep_video` for the ones it uses."""
        known = self._videos.get(key, info)
        return None if known is None else known[0]

    def keep_video(self, key: str, info: os.stat_result, values: object) -> None:
        """Keep an indexed probe that answered (counted as reused) for the next index."""
        self._hits.append(key)
        self._met_videos[key] = (identity(info), values)

    def record_video(self, key: str, info: os.stat_result, values: object) -> None:
        """Keep the probe (JSON values) of the video file `key` whose stat is `info` for the
        next index."""
        self._changed = True
        self._met_videos[key] = (identity(info), values)

    def known_caption(self, key: str, info: os.stat_result) -> str | None:
        """The indexed text of the caption file `key` (stat `info`) when it is unchanged (and
        kept for the next index), else None: the caller reads it and calls `record_caption`."""
        i = self._captions.row(key, info)
        if i is None:
            return None
        text = self._captions.values[i]
        self._met_captions[key] = (identity(info), text)
        return text

    def record_caption(self, key: str, info: os.stat_result, text: str) -> None:
        """Keep the text read from the caption file `key` (stat `info`) for the next index."""
        self._changed = True
        self._met_captions[key] = (identity(info), text)

    def save(self) -> None:
        """Write the entries this scan met, when they differ from the file's. A folder that
        cannot be written keeps no index (the next run reads the files again)."""
        changed = self._changed or self.damaged is not None
        if (
            not changed
            and len(self._met_images) == len(self._images.rows)
            and len(self._met_captions) == len(self._captions.rows)
            and len(self._met_videos) == len(self._videos.rows)
        ):
            return
        body = _body(self._met_images, self._met_captions)
        if self._met_videos:
            body["videos"] = _table(self._met_videos, lambda values: values)
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


def _table(entries: dict, values) -> dict:
    """A kind of entry as the file holds it: names, identities and values in flat columns."""
    numbers = [number for ident, _ in entries.values() for number in ident]
    return {
        "names": list(entries),
        "numbers": numbers,
        "values": [values(entry) for _, entry in entries.values()],
    }


def _body(images: dict, captions: dict) -> dict:
    image_numbers, headers = [], []
    for ident, header in images.values():
        image_numbers.extend(ident)
        headers.extend((*header.size, header.frames))
    caption_numbers, texts = [], []
    for ident, text in captions.values():
        caption_numbers.extend(ident)
        texts.append(text)
    return {
        "images": {"names": list(images), "numbers": image_numbers, "values": headers},
        "captions": {"names": list(captions), "numbers": caption_numbers, "values": texts},
    }
