"""kohya DreamBooth folders: `<repeats>_<class tokens>` subfolders, images and sidecar captions.

Decisions (kohya-compatible unless noted):
- A caption file's caption is its first non-empty line, stripped (as kohya reads it); with
  enable_wildcard every non-empty line is an alternative (library.data.captions picks one per
  sample). It is read as UTF-8; a UTF-8 byte-order mark (Windows Notepad) is skipped.
- An image without a caption file takes the subset's class tokens.
- Unlike kohya, a subfolder without a repeat count, an empty image folder or an empty caption file
  is an error rather than a silently skipped folder or an assertion.
- Hidden entries (names starting with ".", e.g. macOS "._a.png" resource forks) are skipped.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from library.config.dataset_schema import SubsetConfig
from library.errors import DataError

IMAGE_EXTENSIONS = frozenset({".png", ".jpg", ".jpeg", ".webp", ".bmp"})

_REPEATS = re.compile(r"^(\d+)(?:_(.*))?$", re.DOTALL)


@dataclass(frozen=True)
class ImageItem:
    """One image file of a subset with its raw caption."""

    path: Path
    caption: str
    is_reg: bool
    subset_dir: str


def _subfolders(parent: str, role: str, key: str) -> list[Path]:
    root = Path(parent)
    if not root.is_dir():
        raise DataError(f"{role} folder {parent} does not exist; fix {key}")
    folders = sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))
    if not folders:
        raise DataError(
            f"{role} folder {parent} has no subfolders; put the images in subfolders named "
            f'"<repeats>_<class tokens>", e.g. "{parent}/10_sks dog"'
        )
    return folders


def _parse_folder_name(folder: Path) -> tuple[int, str | None]:
    match = _REPEATS.match(folder.name)
    if match is None:
        raise DataError(
            f'image folder {folder} has no repeat count; rename it "<repeats>_<class tokens>", '
            'e.g. "10_sks dog"'
        )
    if int(match.group(1)) < 1:
        raise DataError(f"image folder {folder} repeats its images 0 times; use 1 or more")
    tokens = (match.group(2) or "").strip()
    return int(match.group(1)), tokens or None


def dreambooth_subsets(train_data_dir: str, reg_data_dir: str | None) -> list[dict]:
    """Subset dicts for a kohya DreamBooth layout: train subfolders (sorted), then reg ones.

    "10_sks dog" -> {"image_dir": ".../10_sks dog", "class_tokens": "sks dog", "num_repeats": 10,
    "is_reg": False}. Underscores after the first are kept ("10_sks_dog" -> "sks_dog"); a folder
    named "10" or "10_" has no class tokens (None).
    """
    roles = [(train_data_dir, "train_data_dir", False)]
    if reg_data_dir is not None:
        roles.append((reg_data_dir, "reg_data_dir", True))
    subsets = []
    for parent, key, is_reg in roles:
        role = "regularisation image" if is_reg else "training image"
        for folder in _subfolders(parent, role, key):
            repeats, tokens = _parse_folder_name(folder)
            subsets.append(
                {
                    "image_dir": str(folder),
                    "class_tokens": tokens,
                    "num_repeats": repeats,
                    "is_reg": is_reg,
                }
            )
    return subsets


def read_caption_file(path: Path, all_lines: bool = False) -> str:
    """The caption in a sidecar file: its first non-empty line, stripped; with ``all_lines``
    every non-empty line, stripped and joined by newlines (wildcard alternatives)."""
    try:
        text = path.read_bytes().decode("utf-8-sig")
    except UnicodeDecodeError as error:
        raise DataError(
            f"caption file {path} is not UTF-8 text ({error.reason} at byte {error.start}); "
            "save it as UTF-8"
        ) from error
    except OSError as error:
        raise DataError(f"caption file {path} cannot be read: {error.strerror}") from error
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if lines:
        return "\n".join(lines) if all_lines else lines[0]
    raise DataError(
        f"caption file {path} is empty; write a caption in it or delete it to use the class tokens"
    )


def scan_subset(subset: SubsetConfig) -> list[ImageItem]:
    """The images of one subset folder (sorted by file name) with their captions."""
    folder = Path(subset.image_dir)
    if not folder.is_dir():
        raise DataError(f"image_dir {subset.image_dir} does not exist; fix the path")
    images = sorted(
        (
            p
            for p in folder.iterdir()
            if p.suffix.lower() in IMAGE_EXTENSIONS and p.is_file() and not p.name.startswith(".")
        ),
        key=lambda p: p.name,
    )
    if not images:
        raise DataError(
            f"image_dir {subset.image_dir} has no images "
            f"({', '.join(sorted(IMAGE_EXTENSIONS))}); add images or remove the subset"
        )
    items = []
    for image in images:
        caption_path = image.with_name(image.stem + subset.caption_extension)
        if caption_path.is_file():
            caption = read_caption_file(caption_path, subset.enable_wildcard)
        elif subset.class_tokens:
            caption = subset.class_tokens
        else:
            raise DataError(
                f"image {image} has no caption file {caption_path.name} and its subset has no "
                "class_tokens; add the caption file or set class_tokens"
            )
        items.append(ImageItem(image, caption, subset.is_reg, subset.image_dir))
    return items
