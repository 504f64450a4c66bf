"""kohya DreamBooth folders: `<repeats>_<class tokens>` subfolders, images and sidecar captions.

Decisions (kohya-compatible unless noted):
- A caption file's caption is its first non-empty line, stripped (as kohya reads it); with
  enable_wildcard every non-empty line is an alternative (library.data.captions picks one per
  sample). It is read as UTF-8; a UTF-8 byte-order mark (Windows Notepad) is skipped.
- An image without a caption file takes the subset's class tokens. Without class tokens it is
  trained with the empty caption "" (unconditional), as kohya does; the plan counts such images.
  Because an empty caption file is an error, the caption "" always means "no caption at all".
- Unlike kohya, a subfolder without a repeat count, an empty image folder or an empty caption file
  is an error rather than a silently skipped folder or an assertion. So is a caption path that is
  a folder, a broken link or not a regular file.
- Training images are the files with an extension in IMAGE_EXTENSIONS (any case). An entry with
  such an extension that is a broken link or a folder stays an image, so the image check reports
  it (or, with skip_bad_images, leaves it out and counts it).
- Nothing else is dropped silently: every other entry of an image folder is listed in
  FolderScan.ignored (and in the plan), except caption and sidecar files (SIDECAR_EXTENSIONS and
  the caption extension: captions, kohya's .npz latents, metadata), system files (Thumbs.db,
  desktop.ini) and hidden entries (names starting with ".": .DS_Store, macOS "._a.png" resource
  forks, our .difftune_cache folder).
"""

from __future__ import annotations

import os
import re
from array import array
from dataclasses import dataclass
from itertools import repeat
from pathlib import Path
from stat import S_ISDIR, S_ISREG
from typing import NamedTuple

from PIL import features

from library.config.dataset_schema import SubsetConfig
from library.data import header_workers
from library.data.caption_files import MAX_CAPTION_BYTES as MAX_CAPTION_BYTES
from library.data.caption_files import caption_lines
from library.data.caption_files import caption_too_long as caption_too_long
from library.data.images import ImageHeader
from library.data.listing import Rules, Sorted, sort_folder, sort_names
from library.data.scan_index import ScanIndex, identity
from library.errors import DataError

# Formats of pictures people train on that Pillow opens with a known value mapping (images.py).
# AVIF needs Pillow built with libavif; without it .avif files are listed as ignored.
IMAGE_EXTENSIONS = frozenset(
    {".png", ".apng", ".jpg", ".jpeg", ".jpe", ".jfif", ".webp", ".bmp", ".gif", ".tif", ".tiff"}
    | ({".avif"} if features.check("avif") else set())
)
SIDECAR_EXTENSIONS = frozenset({".txt", ".caption", ".json", ".jsonl", ".csv", ".npz", ".toml"})
SYSTEM_FILES = frozenset({"thumbs.db", "desktop.ini"})  # written by Windows Explorer
_REPEATS = re.compile(r"^(\d+)(?:_(.*))?$", re.DOTALL)


class ImageItem(NamedTuple):
    """One image file of a subset with its raw caption ("" when it has none, folders only); a
    tuple: one is made per image, and a tuple is made quicker than a frozen dataclass."""

    # its path, or the file name of an image directly in ``subset_dir`` (a folder subset's):
    # a million Paths take seconds to make, and a scan asks for few of them
    location: Path | str
    caption: str
    is_reg: bool
    subset_dir: str
    # reference images a metadata file names for it (musubi-tuner's JSONL); a control_directory's
    # are paired while the dataset is scanned (library.data.references)
    references: tuple[Path, ...] = ()

    @property
    def path(self) -> Path:
        """The image file (made anew on each call where ``location`` is a name)."""
        location = self.location
        return location if isinstance(location, Path) else Path(self.subset_dir, location)


def missing_folder(path: str | Path) -> str:
    """Why ``path`` is not a folder: "is a file, not a folder" or "does not exist"."""
    return "is a file, not a folder" if Path(path).exists() else "does not exist"


def _subfolders(parent: str, role: str, key: str) -> list[Path]:
    root = Path(parent)
    if not root.is_dir():
        raise DataError(f"{role} folder {parent} {missing_folder(root)}; fix {key}")
    folders = sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))
    if not folders:
        raise DataError(
            f"{role} folder {parent} has no subfolders; put the images in subfolders named "
            f'"<repeats>_<class tokens>", e.g. "{parent}/10_sks dog"'
        )
    return folders


def _parse_folder_name(folder: Path) -> tuple[int, str | None]:
    """(repeats, class tokens) of a "<repeats>_<class tokens>" folder; DataError without a
    repeat count. 0 repeats is returned as 0 (the caller leaves the folder out)."""
    match = _REPEATS.match(folder.name)
    if match is None:
        raise DataError(
            f'image folder {folder} has no repeat count; rename it "<repeats>_<class tokens>", '
            'e.g. "10_sks dog"'
        )
    tokens = (match.group(2) or "").strip()
    return int(match.group(1)), tokens or None


def dreambooth_subsets(
    train_data_dir: str, reg_data_dir: str | None, skipped: list[str] | None = None
) -> list[dict]:
    """Subset dicts for a kohya DreamBooth layout: train subfolders (sorted), then reg ones.

    "10_sks dog" -> {"image_dir": ".../10_sks dog", "class_tokens": "sks dog", "num_repeats": 10,
    "is_reg": False}. Underscores after the first are kept ("10_sks_dog" -> "sks_dog"); a folder
    named "10" or "10_" has no class tokens (None).

    A subfolder without a repeat count, or with 0 repeats, is an error; with ``skipped`` given it
    is left out instead and a line saying so is appended there (sd-scripts ignores such folders
    with a warning), unless no folder of the parent is left.
    """
    roles = [(train_data_dir, "train_data_dir", False)]
    if reg_data_dir is not None:
        roles.append((reg_data_dir, "reg_data_dir", True))
    subsets = []
    for parent, key, is_reg in roles:
        role = "regularisation image" if is_reg else "training image"
        left_out = []
        folders = _subfolders(parent, role, key)
        for folder in folders:
            try:
                repeats, tokens = _parse_folder_name(folder)
                if repeats < 1:
                    raise DataError(
                        f"image folder {folder} repeats its images 0 times; use 1 or more"
                    )
            except DataError as error:
                if skipped is None:
                    raise
                left_out.append((folder, error))
                continue
            subsets.append(
                {
                    "image_dir": str(folder),
                    "class_tokens": tokens,
                    "num_repeats": repeats,
                    "is_reg": is_reg,
                }
            )
        if left_out and len(left_out) == len(folders):
            raise left_out[0][1]
        for folder, _ in left_out:
            reason = "0 repeats" if _REPEATS.match(folder.name) else "no repeat count in its name"
            skipped.append(
                f'{key} subfolder "{folder.name}" is left out: {reason}, as sd-scripts does'
            )
    return subsets


def read_caption_file(path: Path, all_lines: bool = False) -> str:
    """The caption in a sidecar file: its first non-empty line, stripped; with ``all_lines``
    every non-empty line, stripped and joined by newlines (wildcard alternatives)."""
    return _caption_text(caption_lines(path), all_lines)


def _caption_text(lines: str, all_lines: bool) -> str:
    return lines if all_lines else lines.partition("\n")[0]


# What a listing learnt of an image file: the header the scan index answered for it, else its
# stat_fields (None: it has no stat, a broken link), which the header read takes.
Found = ImageHeader | tuple[int, int, int, int, int] | None


@dataclass(frozen=True)
class FolderScan:
    """A subset's images with captions, and the files beside them that are not trained."""

    items: list[ImageItem]  # sorted by file name
    ignored: tuple[Path, ...]  # neither an image nor a caption, sidecar, system or hidden entry
    unlisted: tuple[Path, ...] = ()  # metadata subsets: images its file does not list
    # per item, what the folder's listing learnt of its file (a folder subset's; None for a
    # metadata subset, whose images are stat'ed where they lie)
    found: list[Found] | None = None


def is_quiet(entry: os.DirEntry, caption_extension: str, suffix: str | None = None) -> bool:
    """True for entries that are expected beside images and not worth reporting. ``suffix``:
    the name's (_suffix), where the caller has it."""
    name = entry.name
    if name.startswith(".") or name.lower() in SYSTEM_FILES:
        return True
    if suffix is None:
        suffix = _suffix(name)
    is_sidecar = suffix in SIDECAR_EXTENSIONS or suffix == caption_extension.lower()
    return is_sidecar and not entry.is_dir()  # a folder "a.txt" is reported, not a caption


def _caption_problem(path: Path) -> str | None:
    """Why an existing entry at a caption path cannot be a caption file, or None if it can."""
    if path.is_file():
        return None
    if path.is_dir():
        return "is a folder, not a caption file; rename or remove it"
    if path.is_symlink() and not path.exists():
        return f"is a link to {os.readlink(path)}, which does not exist; fix or remove the link"
    return "is not a regular file; replace it with a text file or remove it"


# The caption extensions people use: kohya's default (".caption") and the GUIs' (".txt").
_COMMON_CAPTION_EXTENSIONS = (".txt", ".caption")


# Where the listing's entries can be stat'ed by name in the open folder (fstatat: quicker than
# a stat of the whole path). Elsewhere (Windows) an entry's own stat has no inode, so the path is
# stat'ed.
_STAT_IN_FOLDER = os.stat in os.supports_dir_fd


def _sorted_listing(folder: Path, caption_extension: str) -> Sorted:
    """The folder's entries sorted (library.data.listing): a large folder in parts, in worker
    processes and this one, each entry stat'ed by name in the open folder (fstatat: quicker than
    a stat of the whole path). Where that is not possible (Windows: an entry's own stat has no
    inode) the paths are stat'ed."""
    rules = Rules(IMAGE_EXTENSIONS, caption_extension.lower(), SIDECAR_EXTENSIONS, SYSTEM_FILES)
    if not _STAT_IN_FOLDER:
        return sort_names(
            os.listdir(folder),
            lambda name: os.stat(folder / name),
            lambda name: (folder / name).is_dir(),
            rules,
        )
    descriptor = os.open(folder, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        return sort_folder(str(folder), descriptor, rules)
    finally:
        os.close(descriptor)


class _Listing:
    """One listing of an image folder: its image names, the names of its other plain entries, and the entries it reports as ignored.

    Each image and caption file is stat'ed as it is listed, and the scan index asked about them
    all at once: ``found`` (per image of ``images``: Found) and, per caption file of
    ``caption_names`` (both in name order), ``caption_values``: the indexed text, the
    stat_fields of a regular file to read, or None for an entry that is no regular file (left
    to the caption lookup, which names its problem). ``captions`` maps the names to the first
    two (made when a lookup by name is needed)."""

    def __init__(
        self, folder: Path, caption_extension: str, index: ScanIndex | None = None
    ) -> None:
        self.folder = folder
        self.prefix = str(folder)
        self.join_prefix = os.path.join(self.prefix, "")  # + name: os.path.join(prefix, name)
        self.others: set[str] = set()  # every other name: a caption file may have it
        listed = _sorted_listing(folder, caption_extension)
        self.others.update(listed.others)
        ignored = [folder / name for name in listed.reported]
        self.images = listed.images
        self.found = images_found(listed.images, listed.image_stats, index)
        self.caption_names = listed.captions
        self.caption_values = _found_captions(listed.captions, listed.caption_stats, index)
        if None in self.caption_values:  # some are no regular file
            # a folder "a.txt" is reported, not a caption (a hidden one is not)
            ignored += [
                folder / name
                for name, fields in zip(listed.captions, _rows(listed.caption_stats), strict=True)
                if S_ISDIR(fields[0]) and not name.startswith(".")
            ]
        self.ignored = tuple(sorted(ignored, key=lambda p: p.name))
        self._folded: set[str] | None = None
        self._captions: dict[str, str | tuple[int, ...]] | None = None
        self.read: dict[str, str | DataError] = {}  # caption files read ahead (_read_ahead)

    @property
    def captions(self) -> dict[str, str | tuple[int, ...]]:
        """Caption file name -> the indexed text, or the stat_fields of a regular file to read."""
        if self._captions is None:
            self._captions = {
                name: value
                for name, value in zip(self.caption_names, self.caption_values, strict=True)
                if value is not None
            }
        return self._captions

    def may_exist(self, name: str) -> bool:
        """Whether an entry ``name`` may be in the folder: listed under this name, or (a file
        system that ignores case, which finds "a.TXT" as "a.txt") under another case of it."""
        if name in self.others:
            return True
        if self._folded is None:
            self._folded = {other.lower() for other in self.others}
        return name.lower() in self._folded


def _rows(stats: array) -> list[tuple[int, int, int, int, int]]:
    """A listing's stat_fields, one tuple per file."""
    return list(zip(*[iter(stats)] * 5, strict=True))


def images_found(names: list[str], stats: array, index: ScanIndex | None) -> list[Found]:
    """What is known of each image of ``names`` (Found), from its stat_fields in ``stats`` and
    the scan ``index`` (None: none), which knows the images by these names."""
    found: list[Found] = [None] * len(names) if index is None else index.known_images(names, stats)
    if None in found:  # images to read: their stats
        found = [
            header if header is not None else (fields if fields[0] else None)
            for header, fields in zip(found, _rows(stats), strict=True)
        ]
    return found


def _found_captions(
    names: list[str], stats: array, index: ScanIndex | None
) -> list[str | tuple[int, ...] | None]:
    """Per caption file of ``names``: the indexed text, the stat_fields of a regular file to
    read, or None (no regular file)."""
    known = [None] * len(names) if index is None else index.known_captions(names, stats)
    if None not in known:
        return known
    return [
        text if text is not None else (fields if S_ISREG(fields[0]) else None)
        for text, fields in zip(known, _rows(stats), strict=True)
    ]


def _suffix(name: str) -> str:
    """Path(name).suffix, lower case, without building a Path."""
    dot = name.rfind(".")
    return name[dot:].lower() if 0 < dot < len(name) - 1 else ""


def _caption(
    folder: Path, image: str, subset: SubsetConfig, listing: _Listing, index: ScanIndex | None
) -> str:
    """The caption of image file ``image`` (a name) in ``folder``, looked up in its listing;
    caption paths are strings, Paths are made only for a message."""
    stem = image[: image.rfind(".")]
    name = stem + subset.caption_extension
    listed = listing.captions.get(name)
    if listed is None:  # none, or no regular file (or another case of the name)
        return _unlisted_caption(folder, image, name, subset, listing, index)
    if isinstance(listed, str):  # the index's
        return _caption_text(listed, subset.enable_wildcard)
    lines = listing.read.pop(name, None)  # read ahead in parts (_read_ahead)
    if lines is None:
        lines = caption_lines(listing.join_prefix + name)
    elif lines.__class__ is not str:  # the DataError reading it raised, raised in image order
        raise lines
    if index is not None:
        index.record_caption(name, listed[1:], lines)
    return _caption_text(lines, subset.enable_wildcard)


def _read_ahead(listing: _Listing, extension: str) -> None:
    """The caption files of the listing's images that are to be read, read ahead in parts when
    there are many (library.data.header_workers: a first scan's captions use every core), into
    ``listing.read``: name -> its lines, or the DataError reading it raised."""
    known = listing.captions
    names = (image[: image.rfind(".")] + extension for image in listing.images)
    wanted = list(dict.fromkeys(name for name in names if known.get(name).__class__ is tuple))
    read = listing.read

    def here(numbers: list[int]) -> None:
        for n in numbers:
            try:
                read[wanted[n]] = caption_lines(listing.join_prefix + wanted[n])
            except DataError as error:
                read[wanted[n]] = error

    def taken(n: int, lines: header_workers.Read) -> None:
        read[wanted[n]] = header_workers.as_error(lines) or lines

    if header_workers.parts(len(wanted)) > 1:
        header_workers.read_in_parts(
            "captions", len(wanted), lambda n: listing.join_prefix + wanted[n],
            lambda n: None, here, taken,
        )  # fmt: skip


def _unlisted_caption(
    folder: Path,
    image: str,
    name: str,
    subset: SubsetConfig,
    listing: _Listing,
    index: ScanIndex | None,
) -> str:
    """The caption of ``image`` whose caption file ``name`` the listing did not find as a
    regular file: none (the class tokens), another case of the name, or an error naming what
    is there instead."""
    path = listing.join_prefix + name
    info = _stat(path) if listing.may_exist(name) else None
    if info is None and not (listing.may_exist(name) and os.path.lexists(path)):
        _refuse_other_extension(folder / image, subset.caption_extension, listing)
        return subset.class_tokens or ""  # "": no caption at all (module docstring)
    if info is None or not S_ISREG(info.st_mode):
        problem = _caption_problem(Path(path))
        if problem is not None:
            raise DataError(f"caption file {path} (for image {image}) {problem}")
    lines = None if index is None or info is None else index.known_caption(name, info)
    if lines is None:
        lines = caption_lines(path)
        if index is not None and info is not None:
            index.record_caption(name, identity(info), lines)
    return _caption_text(lines, subset.enable_wildcard)


def _stat(path: str) -> os.stat_result | None:
    try:
        return os.stat(path)
    except OSError:
        return None


def _refuse_other_extension(image: Path, extension: str, listing: _Listing) -> None:
    """An image whose caption has the other common extension would silently train without it
    (kohya's default is ".caption", the GUIs' and ours ".txt"): say which key to set."""
    for other in _COMMON_CAPTION_EXTENSIONS:
        name = image.stem + other
        if other == extension or not listing.may_exist(name):
            continue
        found = image.with_name(name)
        if found.is_file():
            raise DataError(
                f"image {image} has no {extension} caption but has {found.name}; set "
                f'caption_extension = "{other}" (the {extension} files are read now)'
            )


def _names(paths: list[Path], shown: int = 3) -> str:
    names = [p.name for p in paths[:shown]] + (["..."] if len(paths) > shown else [])
    return ", ".join(names)


def scan_folder(subset: SubsetConfig, index: ScanIndex | None = None) -> FolderScan:
    """The images of one subset folder (sorted by file name) with their captions, and the
    entries that are ignored (see the module docstring). ``index``: the subset's scan index,
    which answers for caption files that did not change."""
    folder = Path(subset.image_dir)
    if not folder.is_dir():
        raise DataError(f"image_dir {subset.image_dir} {missing_folder(folder)}; fix the path")
    listing = _Listing(folder, subset.caption_extension, index)
    if not listing.images:
        ignored = list(listing.ignored)
        others = f", only {_names(ignored)}" if ignored else ""
        raise DataError(
            f"image_dir {subset.image_dir} has no images ({', '.join(sorted(IMAGE_EXTENSIONS))})"
            f"{others}; add or convert images, or remove the subset"
        )
    return FolderScan(_paired(folder, subset, listing, index), listing.ignored, found=listing.found)


def _paired(
    folder: Path, subset: SubsetConfig, listing: _Listing, index: ScanIndex | None
) -> list[ImageItem]:
    """The listing's images with their captions: where every image has its caption file and
    the index answered for them all (a rerun), the two name-ordered lists are paired as they
    are (a million images pass: no lookup per image); every other case by _caption."""
    extension, whole = subset.caption_extension, subset.enable_wildcard
    is_reg, image_dir, images = subset.is_reg, subset.image_dir, listing.images
    texts = listing.caption_values
    if len(texts) == len(images) and all(map(str.__instancecheck__, texts)):
        wanted = [name[: name.rfind(".")] + extension for name in images]
        if wanted == listing.caption_names:
            captions = texts if whole else [text.partition("\n")[0] for text in texts]
            return list(map(ImageItem, images, captions, repeat(is_reg), repeat(image_dir)))
    _read_ahead(listing, extension)
    known = listing.captions.get
    items = []
    for name in images:
        text = known(name[: name.rfind(".")] + extension)
        if text.__class__ is str:
            caption = text if whole else text.partition("\n")[0]
        else:
            caption = _caption(folder, name, subset, listing, index)
        items.append(ImageItem(name, caption, is_reg, image_dir))
    return items


def scan_subset(subset: SubsetConfig) -> list[ImageItem]:
    """The images of one subset folder (sorted by file name) with their captions."""
    return scan_folder(subset).items
