"""Reference (control) images of edit-model datasets: which files pair with each target image,
and the size each is trained at.

Pairing follows musubi-tuner's rule, so its datasets train unchanged: the references of a target
``a.png`` are the images in the subset's ``control_directory`` named ``a.<ext>`` (any image
extension) and ``a_<n>.<ext>``, in that order, the numbered ones by number. A control file whose
name is itself a target's stem belongs to that target (``a_1.png`` is the reference of a target
``a_1.jpg`` if there is one, else the second reference of ``a``). Unlike musubi-tuner, two files
that would take the same place (``a.png`` and ``a.jpg``, or ``a_1`` and ``a_01``) are an error
rather than an arbitrary order. A metadata file names the references itself (musubi-tuner's
JSONL ``control_path`` / ``control_path_<n>``; library.data.metadata_files).

Size, per subset (musubi-tuner's options): by default a reference is resized and center-cropped
to its target's bucket, as the target is; with ``control_resolution`` it is bucketed like the
targets at that resolution's area, at its own aspect ratio; with ``no_resize_control`` it keeps its
own aspect ratio and size, each side rounded down to a multiple of bucket_reso_steps (fitted to
that size by cover-and-crop, as targets are; musubi-tuner trims without scaling), and is
shrunk only when it is larger than the dataset's resolution area (musubi-tuner would keep a
4000x3000 reference whole, which no GPU trains). With both, as in musubi-tuner,
control_resolution is the largest area a reference keeps.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from library.config.dataset_schema import SubsetConfig
from library.data.buckets import BucketOptions, assign_bucket, bucket_sizes, predefined_buckets
from library.data.folders import IMAGE_EXTENSIONS, missing_folder
from library.errors import DataError

_NUMBERED = re.compile(r"^(.*)_(\d+)$", re.DOTALL)


@dataclass(frozen=True)
class ScannedReference:
    """One reference image of a target: its file, its size as displayed, and the (width,
    height) it is trained at."""

    path: Path
    size: tuple[int, int]
    bucket: tuple[int, int]


def _control_files(folder: Path) -> list[Path]:
    return sorted(
        (
            entry
            for entry in folder.iterdir()
            if entry.suffix.lower() in IMAGE_EXTENSIONS and not entry.name.startswith(".")
        ),
        key=lambda p: p.name,
    )


def _owner(stem: str, targets: set[str]) -> tuple[str, int] | None:
    """(target stem, place) a control file of this stem belongs to: 0 for the target's own
    stem, n + 1 for ``<stem>_<n>``; None when no target claims it."""
    if stem in targets:
        return stem, 0
    numbered = _NUMBERED.match(stem)
    if numbered and numbered.group(1) in targets:
        return numbered.group(1), int(numbered.group(2)) + 1
    return None


def paired_references(
    targets: Sequence[Path], control_directory: str
) -> dict[Path, tuple[Path, ...]]:
    """Each target's reference files in ``control_directory`` in order (module docstring);
    targets without one are left out. The image folder itself pairs each target with itself
    (musubi-tuner trains such pairs; the plan warns, library.data.notes). DataError for a
    missing folder or two files that take one place."""
    folder = Path(control_directory)
    if not folder.is_dir():
        raise DataError(
            f"control_directory {control_directory} {missing_folder(folder)}; fix the path"
        )
    by_stem: dict[str, list[Path]] = {}
    for target in targets:
        by_stem.setdefault(target.stem, []).append(target)
    places: dict[str, dict[int, Path]] = {}
    for control in _control_files(folder):
        owner = _owner(control.stem, set(by_stem))
        if owner is None:
            continue
        stem, place = owner
        taken = places.setdefault(stem, {})
        if place in taken:
            raise DataError(
                f"control_directory {control_directory}: {taken[place].name} and {control.name} "
                f"are both reference {place + 1} of {stem}; rename or remove one"
            )
        taken[place] = control
    return {
        target: tuple(places[stem][p] for p in sorted(places[stem]))
        for stem, same in by_stem.items()
        if stem in places
        for target in same
    }


def _fitted_own_size(size: tuple[int, int], buckets: BucketOptions) -> tuple[int, int]:
    """``size`` shrunk (never enlarged) to the resolution's area, sides rounded down to the
    bucket step; ValueError if a side would vanish."""
    width, height = size
    steps = buckets.bucket_reso_steps
    scale = min(1.0, math.sqrt(buckets.max_area / (width * height)))
    fitted = tuple(int(side * scale) // steps * steps for side in size)
    if min(fitted) < steps:
        raise ValueError(
            f"reference {width}x{height} is smaller than bucket_reso_steps = {steps} on a side; "
            "use a larger reference or resize it (unset no_resize_control)"
        )
    return fitted


@dataclass(frozen=True)
class ReferenceSizing:
    """How one subset sizes its reference images (module docstring): at the target's bucket,
    at their own size (``own``; no larger than ``options``' area when given, else the
    dataset's), or bucketed at ``options``' area (``sizes``: its buckets)."""

    own: bool
    options: BucketOptions | None  # control_resolution's bucket options
    sizes: tuple[tuple[int, int], ...] | None
    dataset: BucketOptions

    def bucket(self, size: tuple[int, int], target_bucket: tuple[int, int]) -> tuple[int, int]:
        """The (width, height) a reference of ``size`` is trained at; ValueError for one that
        cannot be sized so."""
        if self.own:
            return _fitted_own_size(size, self.options or self.dataset)
        if self.options is None:
            return target_bucket
        return assign_bucket(size, self.options, self.sizes)


def reference_sizing(subset: SubsetConfig, buckets: BucketOptions) -> ReferenceSizing:
    """The reference sizing of ``subset`` in a dataset of ``buckets``."""
    if subset.control_resolution is None:
        return ReferenceSizing(subset.no_resize_control, None, None, buckets)
    if subset.no_resize_control:  # control_resolution is the largest area kept
        width, height = subset.control_resolution
        limit = BucketOptions(
            (width, height), False, buckets.min_bucket_reso, buckets.max_bucket_reso,
            buckets.bucket_reso_steps, True, buckets.rule,
        )  # fmt: skip
        return ReferenceSizing(True, limit, None, buckets)
    width, height = subset.control_resolution
    steps = buckets.bucket_reso_steps
    # the bucket range widened, on the step grid, to hold control_resolution's sides
    low = min(buckets.min_bucket_reso, max(steps, min(width, height) // steps * steps))
    high = max(buckets.max_bucket_reso, -(-max(width, height) // steps) * steps)
    options = BucketOptions(
        (width, height), buckets.enable_bucket, low, high, steps, buckets.bucket_no_upscale,
        buckets.rule,
    )  # fmt: skip
    sizes = tuple(bucket_sizes(options)) if predefined_buckets(options) else None
    return ReferenceSizing(False, options, sizes, buckets)
