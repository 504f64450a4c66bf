"""Metadata-style datasets: one file lists the images and their captions.

Formats, chosen by the metadata file's extension:
- `.json`, kohya's fine-tuning metadata: `{"<image>": {"caption": "...", "tags": "..."}, ...}`.
  A relative key is relative to image_dir, or to the JSON file's folder when image_dir is None; an
  absolute key is used as is. A key without an image extension (kohya writes image stems) names
  the first of <key>.png, .jpg, .jpeg, .webp, .bmp, then the other training image extensions
  (library.data.folders.IMAGE_EXTENSIONS) in alphabetical order, that exists (lower case first,
  then upper).
  The caption is "<caption>, <tags>" when both are non-empty, else whichever is non-empty.
- `.jsonl` and `.csv`, the Hugging Face imagefolder `metadata.jsonl` (one JSON object per line,
  blank lines skipped) and `metadata.csv` (a header row, then one row per image): `file_name` is
  relative to the metadata file's folder, or to image_dir when it is given. The caption is the
  "text" field, or "caption" when there is no "text" field.
- `.jsonl` lines in musubi-tuner's image format (musubi-tuner's `image_jsonl_file`): `image_path`
  and `caption`, and for edit models the reference images `control_path` or `control_path_<n>`
  (in that order, by n). Paths are taken as written when absolute, else from the metadata
  file's folder (or image_dir when it is given).
Files are read as UTF-8; a byte-order mark (Windows editors, Excel) is skipped. Captions keep their
inner line breaks (the lines are wildcard alternatives) and lose surrounding whitespace; an empty
caption is an error, as an empty caption file is for folder subsets. Duplicate JSON keys, two
entries naming the same image, an entry whose image does not exist and a file without entries are
errors; each names the file and the entry or line. An entry whose image is a broken link is
left to the image check, so skip_bad_images applies to it as to other unreadable images.
Images in the folder the names start from that the file does not list are not trained;
unlisted_images names them so the plan can say so.
"""

from __future__ import annotations

import csv
import io
import json
import os
from dataclasses import dataclass
from pathlib import Path

from library.data.folders import (
    IMAGE_EXTENSIONS,
    MAX_CAPTION_BYTES,
    caption_too_long,
    missing_folder,
)
from library.errors import DataError

_KOHYA_LOOKUP = (".png", ".jpg", ".jpeg", ".webp", ".bmp")  # kohya's order
LOOKUP_EXTENSIONS = _KOHYA_LOOKUP + tuple(sorted(IMAGE_EXTENSIONS - set(_KOHYA_LOOKUP)))


@dataclass(frozen=True)
class MetadataEntry:
    """One image listed in a metadata file with its raw caption."""

    path: Path
    caption: str
    references: tuple[Path, ...] = ()  # its reference images, in order (musubi-tuner's JSONL)


class _DuplicateKey(Exception):
    def __init__(self, key: str) -> None:
        super().__init__(key)
        self.key = key


def _no_duplicate_keys(pairs: list[tuple[str, object]]) -> dict[str, object]:
    result: dict[str, object] = {}
    for key, value in pairs:
        if key in result:
            raise _DuplicateKey(key)
        result[key] = value
    return result


def _not_a_file(path: Path) -> str:
    """What is at ``path`` instead of a file: a folder, nothing, or a special file (a link to
    /dev/zero, a FIFO) that would never end or never start when read."""
    if path.is_dir():
        return "is a folder"
    if path.exists():
        return "is not a regular file (a device, pipe or socket)"
    return "does not exist"


def read_text(path: Path) -> str:
    """The text of a metadata file; DataError naming it when it is missing or not UTF-8."""
    if not path.is_file():
        raise DataError(f"metadata_file {path} {_not_a_file(path)}; fix metadata_file")
    try:
        return path.read_bytes().decode("utf-8-sig")
    except UnicodeDecodeError as error:
        raise DataError(
            f"metadata file {path} is not UTF-8 text ({error.reason} at byte {error.start}); "
            "save it as UTF-8"
        ) from error
    except OSError as error:
        raise DataError(f"metadata file {path} cannot be read: {error.strerror}") from error


def parse_json(text: str, path: Path, line: int | None = None) -> object:
    """``text`` (all of a metadata file, or its ``line``) as JSON; DataError naming the place."""
    where = f"metadata file {path}" + (f" line {line}" if line is not None else "")
    try:
        return json.loads(text, object_pairs_hook=_no_duplicate_keys)
    except json.JSONDecodeError as error:
        at = f"column {error.colno}" if line is not None else f"line {error.lineno}"
        raise DataError(f"{where} is not valid JSON ({error.msg} at {at}); fix the JSON") from error
    except _DuplicateKey as error:
        raise DataError(f'{where} has the key "{error.key}" twice; keep one of them') from error


def _is_listed_file(path: Path) -> bool:
    """True for anything at ``path``, or a link (even a broken one): the image check says what
    is wrong with a folder, a broken link or a file that is not a regular one (a FIFO)."""
    return path.exists() or path.is_symlink()


def _kohya_image(base: Path, key: str, where: str) -> Path:
    path = base / key
    if path.suffix.lower() in IMAGE_EXTENSIONS:
        if _is_listed_file(path):
            return path
        raise DataError(f"{where}: image {path} does not exist; fix the key or image_dir")
    for ext in LOOKUP_EXTENSIONS:
        for candidate in (base / (key + ext), base / (key + ext.upper())):
            if _is_listed_file(candidate):
                return candidate
    raise DataError(
        f"{where}: no image {path}{{{','.join(LOOKUP_EXTENSIONS)}}} exists; "
        "fix the key or image_dir"
    )


def _text_field(record: dict, name: str, where: str) -> str:
    value = record.get(name)
    if value is None:
        return ""
    if not isinstance(value, str):
        raise DataError(f'{where}: "{name}" must be a string, got {type(value).__name__}')
    # 4 bytes per character at most: only a long text needs encoding to be measured
    if len(value) * 4 > MAX_CAPTION_BYTES and len(value.encode()) > MAX_CAPTION_BYTES:
        raise DataError(caption_too_long(f'{where}: "{name}"', len(value.encode())))
    return value.strip()


def _kohya_entries(path: Path, image_dir: Path | None) -> list[tuple[str, MetadataEntry]]:
    data = parse_json(read_text(path), path)
    if not isinstance(data, dict):
        raise DataError(
            f'metadata file {path} must hold a JSON object {{"<image>": {{"caption": ...}}}}, '
            f"not a {type(data).__name__}"
        )
    base = image_dir if image_dir is not None else path.parent
    entries = []
    for key, record in data.items():
        where = f'metadata file {path} entry "{key}"'
        if not isinstance(record, dict):
            raise DataError(f'{where} must be an object {{"caption": ..., "tags": ...}}')
        parts = [_text_field(record, name, where) for name in ("caption", "tags")]
        caption = ", ".join(part for part in parts if part)
        if not caption:
            raise DataError(f'{where} has no "caption" or "tags"; add one or remove the entry')
        entries.append((f'entry "{key}"', MetadataEntry(_kohya_image(base, key, where), caption)))
    return entries


def _imagefolder_entry(record: dict, base: Path, where: str) -> MetadataEntry:
    columns = ", ".join(str(name) for name in record) or "none"
    name = record.get("file_name")
    if not isinstance(name, str) or not name.strip():
        raise DataError(f'{where} has no "file_name" (columns found: {columns}); add it')
    column = "text" if "text" in record else "caption" if "caption" in record else None
    if column is None:
        raise DataError(
            f'{where} has no "text" or "caption" column (columns found: {columns}); add one'
        )
    caption = _text_field(record, column, where)
    if not caption:
        raise DataError(f'{where} has an empty "{column}"; write a caption or remove the line')
    return MetadataEntry(_listed_image(base, name, "file_name", where), caption)


def _listed_image(base: Path, name: object, field: str, where: str) -> Path:
    """An image a record names in ``field``: relative to ``base``, existing, a training image."""
    if not isinstance(name, str) or not name.strip():
        raise DataError(f'{where}: "{field}" must be a file name, got {name!r}')
    image = base / name.strip()
    if image.suffix.lower() not in IMAGE_EXTENSIONS:
        raise DataError(
            f"{where}: {image.name} is not a training image "
            f"({', '.join(sorted(IMAGE_EXTENSIONS))}); convert it or remove the line"
        )
    if not _is_listed_file(image):
        raise DataError(f'{where}: image {image} does not exist; fix "{field}" or image_dir')
    return image


def _control_fields(record: dict, where: str) -> list[str]:
    """musubi-tuner's reference fields of a record in order: control_path (the first), then
    control_path_<n> by n."""
    numbered = {}
    for name in record:
        if name.startswith("control_path_"):
            suffix = name[len("control_path_") :]
            if not suffix.isdigit():
                raise DataError(f'{where}: "{name}" must end in a number (control_path_0, ...)')
            numbered[name] = int(suffix)
    if "control_path" in record and 0 in numbered.values():
        raise DataError(f'{where} has both "control_path" and "control_path_0"; keep one')
    first = ["control_path"] if "control_path" in record else []
    return first + sorted(numbered, key=numbered.get)


def _musubi_entry(record: dict, base: Path, where: str) -> MetadataEntry:
    """A record of musubi-tuner's image JSONL: image_path, caption, control_path(_<n>)."""
    if "image_path_1" in record:
        raise DataError(
            f"{where} names several target images (image_path_1, musubi-tuner's "
            "multiple_target), which difftune does not train; keep image_path"
        )
    field = "image_path" if "image_path" in record else "image_path_0"
    caption = _text_field(record, "caption", where)
    if not caption:
        raise DataError(f'{where} has no "caption"; write a caption or remove the line')
    image = _listed_image(base, record[field], field, where)
    controls = tuple(
        _listed_image(base, record[name], name, where) for name in _control_fields(record, where)
    )
    return MetadataEntry(image, caption, controls)


def _names_musubi_image(record: dict) -> bool:
    return "image_path" in record or "image_path_0" in record


def _jsonl_entries(path: Path, base: Path) -> list[tuple[str, MetadataEntry]]:
    entries = []
    # split("\n"), not splitlines(): JSON strings may hold U+2028 and other line separators.
    for number, line in enumerate(read_text(path).split("\n"), start=1):
        if not line.strip():
            continue
        record = parse_json(line, path, number)
        where = f"metadata file {path} line {number}"
        if not isinstance(record, dict):
            raise DataError(f'{where} must be a JSON object {{"file_name": ..., "text": ...}}')
        if "file_name" not in record and not _names_musubi_image(record):
            columns = ", ".join(str(name) for name in record) or "none"
            raise DataError(
                f'{where} names no image: add "image_path" (musubi-tuner\'s image JSONL) or '
                f'"file_name" (Hugging Face imagefolder) (fields found: {columns})'
            )
        read = _musubi_entry if _names_musubi_image(record) else _imagefolder_entry
        entries.append((f"line {number}", read(record, base, where)))
    return entries


def _csv_entries(path: Path, base: Path) -> list[tuple[str, MetadataEntry]]:
    reader = csv.DictReader(io.StringIO(read_text(path), newline=""))
    entries = []
    try:
        for record in reader:
            where = f"metadata file {path} line {reader.line_num}"
            if None in record:
                raise DataError(f"{where} has more cells than the header; fix the row")
            entries.append((f"line {reader.line_num}", _imagefolder_entry(record, base, where)))
    except csv.Error as error:
        raise DataError(
            f"metadata file {path} line {reader.line_num} is not valid CSV ({error}); fix it"
        ) from error
    return entries


def _file_identity(path: Path) -> tuple:
    """(device, inode) of the file at ``path`` from one stat, or, where it cannot be stat'ed (a
    broken link, a missing file), its resolved path. Two paths to one file (links, "a/../b")
    have the same identity; so have hard links, which are told apart by resolving them."""
    try:
        info = os.stat(path)
    except OSError:
        return ("path", str(path.resolve()))
    return (info.st_dev, info.st_ino)


class _Files:
    """Paths grouped by the file they reach: `find` gives the path added before that resolves
    like the one asked about (the same path, through links), or None. One stat per path; only
    paths of one file are resolved (hard links, or the same image named twice)."""

    def __init__(self) -> None:
        self._exact: set[str] = set()
        self._by_file: dict[tuple, list[Path]] = {}

    def add(self, path: Path) -> None:
        self._exact.add(str(path))
        self._by_file.setdefault(_file_identity(path), []).append(path)

    def find(self, path: Path) -> Path | None:
        if str(path) in self._exact:
            return path
        same = self._by_file.get(_file_identity(path))
        if not same:
            return None
        resolved = path.resolve()
        return next((other for other in same if other.resolve() == resolved), None)


def _checked(path: Path, entries: list[tuple[str, MetadataEntry]]) -> list[MetadataEntry]:
    if not entries:
        raise DataError(f"metadata file {path} lists no images; add entries or remove the subset")
    files, labels = _Files(), {}
    for label, entry in entries:
        other = files.find(entry.path)
        if other is not None:
            raise DataError(
                f"metadata file {path} lists image {entry.path} twice ({labels[other]} and "
                f"{label}); keep one of them"
            )
        files.add(entry.path)
        labels[entry.path] = label
    return sorted((entry for _, entry in entries), key=lambda entry: entry.path)


def read_metadata_entries(
    metadata_file: str | Path, image_dir: str | Path | None
) -> list[MetadataEntry]:
    """The images and raw captions a metadata file lists, sorted by image path.

    The format follows the extension (.json kohya, .jsonl / .csv Hugging Face imagefolder; see
    the module docstring). Raises DataError naming the file and entry for any unusable entry.
    """
    path = Path(metadata_file)
    folder = Path(image_dir) if image_dir is not None else None
    if folder is not None and not folder.is_dir():
        raise DataError(
            f"image_dir {image_dir} (for metadata file {path}) {missing_folder(folder)}; fix "
            "image_dir"
        )
    suffix = path.suffix.lower()
    if suffix == ".json":
        entries = _kohya_entries(path, folder)
    elif suffix in (".jsonl", ".csv"):
        base = folder if folder is not None else path.parent
        read = _jsonl_entries if suffix == ".jsonl" else _csv_entries
        entries = read(path, base)
    else:
        raise DataError(
            f"metadata_file {path} has an unknown extension; use .json (kohya), "
            ".jsonl or .csv (Hugging Face imagefolder)"
        )
    return _checked(path, entries)


def unlisted_images(folder: str | Path, entries: list[MetadataEntry]) -> tuple[Path, ...]:
    """The training images directly in `folder` (hidden names aside) that no entry names, sorted
    by name: the metadata file leaves them out of training."""
    listed = _Files()
    for entry in entries:
        listed.add(entry.path)
    return tuple(
        path
        for path in sorted(Path(folder).iterdir(), key=lambda p: p.name)
        if path.suffix.lower() in IMAGE_EXTENSIONS
        and not path.name.startswith(".")
        and listed.find(path) is None
    )
