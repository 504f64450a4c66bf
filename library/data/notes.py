"""Warnings about images that train, but not as their files look: found while the data is
scanned, printed once per dataset with the plan (count and the first few names).

- An image (target or reference) enlarged more than ENLARGE_LIMIT times on a side to cover the
  size it is trained at: a 1x1 or 32x32 file becomes a blur of its few pixels.
- An image whose crop keeps less than KEPT_LIMIT of its area: an extreme aspect ratio (20000x20)
  that no bucket comes near trains on a small middle piece of it.
- A target that is its own reference (control_directory is the image folder, or a JSONL line's
  control_path is its image_path): an edit that changes nothing. musubi-tuner trains such pairs
  and its users make them on purpose, so they train too.

kohya's sd-scripts and musubi-tuner enlarge and crop such images without a word; difftune trains
them the same way and says so, since none of them makes training itself wrong.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from pathlib import Path

ENLARGE_LIMIT = 4  # a side grown more than 4x: 4x4 trained pixels per file pixel
KEPT_LIMIT = 0.5  # less than half of the image's area left after the crop
MAX_NAMES = 3  # names shown per warning


def cover_scale(size: tuple[int, int], bucket: tuple[int, int]) -> float:
    """The factor an image of ``size`` is resized by to cover ``bucket`` (both width, height)."""
    return max(bucket[0] / size[0], bucket[1] / size[1])


def kept_fraction(size: tuple[int, int], bucket: tuple[int, int]) -> float:
    """The part of an image's area that the crop to ``bucket`` keeps after covering it."""
    scale = cover_scale(size, bucket)
    return bucket[0] * bucket[1] / (size[0] * scale * size[1] * scale)


def _names(files: Sequence) -> str:
    """The first few of ``files`` (each with a ``path``) by folder and name, "..." for more:
    only those shown have their Path made (a dataset of small images may list all of them)."""
    shown = [f"{f.path.parent.name}/{f.path.name}" for f in files[:MAX_NAMES]]
    return ", ".join(shown + (["..."] if len(files) > MAX_NAMES else []))


def _sized(scanned) -> Iterable[tuple[object, tuple[int, int], tuple[int, int]]]:
    """(the image's item or the reference, size, trained size) of every image of a dataset;
    each has a ``path`` (an item's is made when asked: most never are)."""
    for image in scanned.images + scanned.validation:
        yield image.item, image.size, image.bucket
        for reference in image.references:
            yield reference, reference.size, reference.bucket


def dataset_warnings(index: int, scanned) -> list[str]:
    """The warnings (module docstring) about dataset ``index`` (a ScannedDataset)."""
    enlarged, cropped = [], []  # items and references
    for image, size, bucket in _sized(scanned):
        if cover_scale(size, bucket) > ENLARGE_LIMIT:
            enlarged.append(image)
        elif kept_fraction(size, bucket) < KEPT_LIMIT:
            cropped.append(image)
    own = [
        image.item
        for image in scanned.images + scanned.validation
        if any(_same_file(image.item.path, r.path) for r in image.references)
    ]
    lines = []
    if enlarged:
        lines.append(
            f"dataset {index}: {len(enlarged)} images or references are enlarged more than "
            f"{ENLARGE_LIMIT}x on a side to their training size, so they train blurred "
            f"({_names(enlarged)}); use larger files or remove them"
        )
    if cropped:
        lines.append(
            f"dataset {index}: {len(cropped)} images or references lose more than half their "
            f"area to the crop, their aspect ratio far from every bucket's ({_names(cropped)}); "
            "crop them yourself or remove them"
        )
    if own:
        lines.append(
            f"dataset {index}: {len(own)} images are their own reference image (the same file "
            f"as target and control, {_names(own)}): each trains an edit that changes nothing, "
            "as musubi-tuner trains it"
        )
    return lines


def _same_file(a: Path, b: Path) -> bool:
    """Whether ``a`` and ``b`` are one file (through links too): two stats, where resolving
    both paths would look at every folder above them, for every reference of the dataset."""
    try:
        return a == b or os.path.samefile(a, b)
    except OSError:  # the scan read both; one gone since is not the same file
        return False
