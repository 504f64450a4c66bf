"""Scanning a dataset: its images with captions, sizes, buckets and the validation hold-out.

A subset's images come from a folder (sidecar captions, library.data.folders) or a metadata file
(library.data.metadata_files). Every image header is read once here, so a bad file stops the run
before training starts, or, with skip_bad_images, is left out with a warning and counted. What
the plan reports besides is collected here too: animated images (their first frame is trained),
folder entries that are not training images, and images a metadata file does not list.

A video subset's videos are probed in the same pass, and each gives one sample per clip
(library.data.clips): a ScannedImage whose ``frames`` name the clip's frames.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from library.config.dataset_schema import DatasetConfig, SubsetConfig
from library.data.augment import AugmentOptions
from library.data.buckets import BucketOptions, assign_bucket, bucket_sizes, predefined_buckets
from library.data.captions import CaptionOptions
from library.data.clips import MODEL_FPS, ClipOptions, clip_frames, probe_all, video_items
from library.data.folders import FolderScan, ImageItem, scan_folder
from library.data.header_scan import look_up, name_in, path_prefix, read_headers
from library.data.images import ImageHeader, read_image_header
from library.data.metadata_files import read_metadata_entries, unlisted_images
from library.data.references import (
    ReferenceSizing,
    ScannedReference,
    paired_references,
    reference_sizing,
)
from library.data.scan_index import ScanIndex
from library.data.validation_split import validation_indices
from library.errors import ConfigError, DataError

CACHE_FOLDER = ".difftune_cache"


class ScannedImage(NamedTuple):
    """One usable image of a dataset (a tuple: one is made per image, and a tuple is made
    quicker than a frozen dataclass)."""

    item: ImageItem  # path, raw caption, is_reg
    subset: int  # index of its subset in the dataset
    size: tuple[int, int]  # (width, height) as displayed
    bucket: tuple[int, int]  # (width, height) it is trained at
    key: str  # "<subset>/<path relative to the subset folder>": names it for the validation split
    cache_root: Path  # folder of its disk-cache entries
    references: tuple[ScannedReference, ...] = ()  # edit models' reference images, in order
    frames: tuple[int, ...] = ()  # a clip's frames in its video (library.data.clips); () image

    @property
    def frame_count(self) -> int:
        """Frames of the sample: 1 for an image."""
        return len(self.frames) or 1

    @property
    def split_key(self) -> str:
        """What the validation split holds out together: an image, or every clip of a video
        (its clips' keys are "<video key>@<first frame>+<frames>"), so no validation clip
        shares frames with a trained one."""
        return self.key.rpartition("@")[0] if self.frames else self.key

    @property
    def group_key(self) -> tuple:
        """What the samples of one micro-batch share: the bucket, their references' sizes and
        their frame count."""
        references = self.references and tuple(reference.bucket for reference in self.references)
        return (self.bucket, references, len(self.frames) or 1)


@dataclass(frozen=True)
class SubsetOptions:
    """What a subset's keys do to each of its samples."""

    captions: CaptionOptions
    augment: AugmentOptions
    alpha_mask: bool


@dataclass(frozen=True)
class ScannedDataset:
    """A dataset's training images, held-out validation images, and the files left out."""

    config: DatasetConfig
    images: tuple[ScannedImage, ...]  # training (and reg) images, subsets in order
    validation: tuple[ScannedImage, ...]
    options: tuple[SubsetOptions, ...]  # per subset
    skipped: tuple[str, ...]  # "<path>: <reason>" of unreadable images left out
    animated: tuple[Path, ...] = ()  # usable images with several frames: the first is trained
    ignored: tuple[Path, ...] = ()  # folder entries that are not training images (FolderScan)
    unlisted: tuple[Path, ...] = ()  # images beside a metadata file that it does not list
    indexed: int = 0  # image headers the scan index answered (files unchanged since)
    short_videos: tuple[Path, ...] = ()  # videos shorter than every clip length: no sample


def subset_options(subset: SubsetConfig) -> SubsetOptions:
    """The caption, augmentation and mask options of a subset config."""
    augment = AugmentOptions(subset.flip_aug, subset.random_crop, subset.color_aug)
    return SubsetOptions(CaptionOptions.from_subset(subset), augment, subset.alpha_mask)


def bucket_options(config: DatasetConfig) -> BucketOptions:
    """The bucket settings of a dataset config."""
    width, height = config.resolution
    return BucketOptions(
        (width, height),
        config.enable_bucket,
        config.min_bucket_reso,
        config.max_bucket_reso,
        config.bucket_reso_steps,
        config.bucket_no_upscale,
        config.bucketing,
    )


def _subset_items(subset: SubsetConfig, index: ScanIndex | None) -> FolderScan:
    if subset.metadata_file is None:
        return scan_folder(subset, index)
    entries = read_metadata_entries(subset.metadata_file, subset.image_dir)
    folder = subset.image_dir or str(Path(subset.metadata_file).parent)
    items = [ImageItem(e.path, e.caption, subset.is_reg, folder, e.references) for e in entries]
    return FolderScan(items, (), unlisted_images(folder, entries))


class _Keys:
    """The validation-split keys of one subset's images: "<subset>/<path relative to the subset
    folder>". The path is taken as written where it lies under the folder as written (every
    image of a folder subset: no file system call); only other paths (a metadata file may name
    images by another path, or outside its folder) are resolved."""

    def __init__(self, index: int, subset_dir: str) -> None:
        self.index = index
        self.folder = Path(subset_dir)
        self._resolved: Path | None = None

    def __call__(self, path: Path) -> str:
        name = name_in(path, self.folder)
        if name is not None:
            return f"{self.index}/{name}"
        if self._resolved is None:
            self._resolved = self.folder.resolve()
        try:
            relative = path.resolve().relative_to(self._resolved)
        except ValueError:  # a metadata file may name images outside its folder
            relative = Path(os.path.abspath(path))
        return f"{self.index}/{relative.as_posix()}"


def _names_in_folder(items: list[ImageItem], subset: SubsetConfig) -> list[str] | None:
    """The file names of a folder subset's images (all directly in its folder); None for a
    metadata subset, whose images may lie anywhere."""
    if subset.metadata_file is not None:
        return None
    return [item.location for item in items]


class _CacheRoots:
    """The folder of each image's disk-cache entries: the subset's cache_directory, else
    cache_dir, else a folder beside the image; one Path object per folder, not per image."""

    def __init__(self, subset: SubsetConfig, cache_dir: str | None) -> None:
        fixed = subset.cache_directory or cache_dir
        self._fixed = Path(fixed) if fixed else None
        self._beside: dict[Path, Path] = {}
        # a folder subset's images all lie directly in its folder
        folder = Path(subset.image_dir or subset.video_directory or ".")
        self.folder_root = self._fixed or folder / CACHE_FOLDER

    def __call__(self, image: Path) -> Path:
        if self._fixed is not None:
            return self._fixed
        parent = image.parent
        root = self._beside.get(parent)
        if root is None:
            root = self._beside[parent] = parent / CACHE_FOLDER
        return root


def _with_references(scan: FolderScan, subset: SubsetConfig) -> list[ImageItem]:
    """The scanned items with the references a control_directory pairs with them."""
    if subset.control_directory is None:
        return scan.items
    listed = next((item for item in scan.items if item.references), None)
    if listed is not None:
        raise DataError(
            f"metadata file {subset.metadata_file} names reference images (control_path) and "
            f"control_directory {subset.control_directory} pairs them too; keep one of the two"
        )
    pairs = paired_references([item.path for item in scan.items], subset.control_directory)
    return [item._replace(references=pairs.get(item.path, ())) for item in scan.items]


def _checked_references(
    item: ImageItem, bucket: tuple[int, int], subset: SubsetConfig, sizing: ReferenceSizing
) -> tuple[ScannedReference, ...]:
    """The references of a usable image, each read and sized; DataError for a missing, unreadable
    or unsizable one (the image's problem, like an unreadable image)."""
    wanted = subset.control_count_per_image
    found = item.references
    if subset.control_directory is not None:
        where = f"control_directory {subset.control_directory}"
        names = f"{item.path.stem}.<ext>, then {item.path.stem}_0.<ext>, {item.path.stem}_1.<ext>"
    else:
        where, names = f"metadata file {subset.metadata_file}", "control_path, control_path_1"
    if not found:
        raise DataError(
            f"image {item.path} has no reference image in {where} ({names}, ...); add one or "
            "remove the image"
        )
    if wanted is not None and len(found) < wanted:
        raise DataError(
            f"image {item.path} has {len(found)} reference images in {where} and "
            f"control_count_per_image = {wanted}; add references or lower control_count_per_image"
        )
    references = []
    for path in found[:wanted]:
        header = read_image_header(path)
        try:
            sized = sizing.bucket(header.size, bucket)
        except ValueError as error:
            raise DataError(f"reference image {path} of {item.path}: {error}") from None
        references.append(ScannedReference(Path(path), header.size, sized))
    return tuple(references)


class _Buckets:
    """assign_bucket memoised by image size: a dataset has far fewer sizes than images."""

    def __init__(self, options: BucketOptions, sizes: list[tuple[int, int]] | None) -> None:
        self.options, self.sizes = options, sizes
        self._known: dict[tuple[int, int], tuple[int, int] | str] = {}

    def __call__(self, size: tuple[int, int]) -> tuple[int, int]:
        bucket = self._known.get(size)
        if bucket is None:
            try:
                bucket = assign_bucket(size, self.options, self.sizes)
            except ValueError as error:
                bucket = str(error)
            self._known[size] = bucket
        if isinstance(bucket, str):
            raise ValueError(bucket)
        return bucket


def _checked_image(
    item: ImageItem,
    header: ImageHeader | DataError,
    subset: SubsetConfig,
    bucket_of: _Buckets,
    sizing: ReferenceSizing | None,
    skip_bad_images: bool,
) -> tuple[tuple[int, int], tuple[int, int], bool, tuple[ScannedReference, ...]] | str:
    """(size, bucket, animated, references) of a usable image, or the problem of one left out
    (only with skip_bad_images; otherwise the problem is raised). ``header``: what reading its
    header gave. ``sizing``: the subset's reference sizing when its images take references (an
    image without its references is unusable), None when they take none."""
    try:
        if isinstance(header, DataError):
            raise header
        bucket = bucket_of(header.size)
        references = () if sizing is None else _checked_references(item, bucket, subset, sizing)
    except (DataError, ValueError) as error:
        problem = str(error) if isinstance(error, DataError) else f"image {item.path}: {error}"
        if not skip_bad_images:
            raise DataError(f"{problem} (or set skip_bad_images = true)") from None
        return problem
    return header.size, bucket, header.animated, references


def scan_index_path(subset: SubsetConfig, cache_dir: str | None, keep: bool) -> Path | None:
    """Where a subset's scan index lives: "scan/<name>.json" in the folder of its disk caches
    (its cache_directory, else cache_dir, else, with ``keep``, the .difftune_cache folder of its
    image folder); None (no index) when neither is set and ``keep`` is false. The name is a
    digest of the subset's folder and metadata file as absolute paths."""
    listed = subset.metadata_file or subset.video_jsonl_file
    folder = subset.image_dir or subset.video_directory or str(Path(listed).parent)
    root = (
        subset.cache_directory or cache_dir or (str(Path(folder) / CACHE_FOLDER) if keep else None)
    )
    if root is None:
        return None
    # no metadata file: "" (not the working folder, which abspath("") would give)
    names = [os.path.abspath(folder), os.path.abspath(listed) if listed else ""]
    digest = hashlib.blake2b("\0".join(names).encode(), digest_size=12).hexdigest()
    return Path(root) / "scan" / f"{digest}.json"


def scan_dataset(
    index: int,
    config: DatasetConfig,
    seed: int,
    skip_bad_images: bool,
    cache_dir: str | None,
    keep_index: bool = False,
    frame_rate: float = MODEL_FPS,
) -> ScannedDataset:
    """Scan and check every subset of dataset `index`; split off its validation images.
    ``keep_index``: keep a scan index (scan_index_path) even where no cache folder is set.
    ``frame_rate``: the model's, which a video subset's source_fps resamples to."""
    if all(subset.is_reg for subset in config.subsets):
        raise DataError(
            f"dataset {index} has only regularisation subsets (is_reg = true); add a subset of "
            "training images"
        )
    options = _options(index, config)
    buckets = bucket_options(config)
    try:
        buckets.check()
    except ValueError as error:
        raise DataError(f"dataset {index}: {error}") from None
    bucket_of = _Buckets(buckets, bucket_sizes(buckets) if predefined_buckets(buckets) else None)
    images, skipped, animated, ignored, unlisted, short_videos = [], [], [], [], [], []
    reused = 0
    sizes: dict[tuple[int, int], tuple[int, int]] = {}
    for s, subset in enumerate(config.subsets):
        path = scan_index_path(subset, cache_dir, keep_index)
        scan_index = None if path is None else ScanIndex(path)
        if subset.is_video:
            found, problems, short, others = _video_samples(
                s, subset, bucket_of, cache_dir, scan_index, skip_bad_images, frame_rate
            )
            _check_usable(index, subset, found, problems)
            images += found
            skipped += problems
            short_videos += short
            ignored += others
            if scan_index is not None:
                reused += scan_index.reused
                scan_index.save()
            continue
        scan = _subset_items(subset, scan_index)
        ignored += scan.ignored
        unlisted += scan.unlisted
        items = _with_references(scan, subset)
        takes_references = subset.control_directory is not None or any(i.references for i in items)
        sizing = reference_sizing(subset, buckets) if takes_references else None
        if takes_references and (subset.random_crop or subset.color_aug):
            key = "random_crop" if subset.random_crop else "color_aug"
            raise ConfigError(
                f"datasets[{index}].subsets[{s}]: {key} would change an image but not its "
                "reference images, which must stay aligned with it; remove it"
            )
        keys = _Keys(s, items[0].subset_dir if items else ".")
        root_of = _CacheRoots(subset, cache_dir)
        # a folder's images are all directly in it: their names are their keys
        names = _names_in_folder(items, subset)
        if names is None:
            paths = [item.path for item in items]
            index_keys = [name_in(path, keys.folder) or str(path) for path in paths]
            found, path_of = look_up(paths, scan_index, index_keys), paths.__getitem__
        else:
            index_keys, found = names, scan.found
            prefix = path_prefix(Path(subset.image_dir))

            def path_of(i: int, prefix: str = prefix, names: list[str] = names) -> str:
                return prefix + names[i]  # a million Paths would take seconds to make

        headers = read_headers(found, path_of, scan_index, index_keys)
        found = []
        # without references an image's checks depend on its header alone: a dataset has far
        # fewer distinct headers than images, each checked once
        usable: dict[ImageHeader, tuple] = {}
        for n, (item, header) in enumerate(zip(items, headers, strict=True)):
            checked = usable.get(header) if sizing is None else None
            if checked is None:
                checked = _checked_image(item, header, subset, bucket_of, sizing, skip_bad_images)
                if isinstance(checked, str):
                    skipped.append(checked)
                    continue
                size = sizes.setdefault(checked[0], checked[0])  # one tuple per size
                checked = (size, *checked[1:])
                if sizing is None:
                    usable[header] = checked
            size, bucket, is_animated, references = checked
            if is_animated:
                animated.append(item.path)
            if names is None:
                key, root = keys(item.path), root_of(item.path)
            else:
                key, root = f"{s}/{names[n]}", root_of.folder_root
            found.append(ScannedImage(item, s, size, bucket, key, root, references))
        _check_usable(index, subset, found, skipped)
        images.extend(found)
        if scan_index is not None:
            reused += scan_index.reused
            scan_index.save()
    train, validation = _hold_out(images, config, seed)
    return ScannedDataset(
        config,
        tuple(train),
        tuple(validation),
        options,
        tuple(skipped),
        tuple(animated),
        tuple(ignored),
        tuple(unlisted),
        reused,
        tuple(short_videos),
    )


def _check_usable(index: int, subset: SubsetConfig, found: list, skipped: list) -> None:
    if not found:
        what = "clips" if subset.is_video else "images"
        raise DataError(
            f"dataset {index}: {subset.source} has no usable {what} ({len(skipped)} unreadable "
            "ones left out)"
        )


def _video_samples(
    s: int,
    subset: SubsetConfig,
    bucket_of: _Buckets,
    cache_dir: str | None,
    scan_index: ScanIndex | None,
    skip_bad: bool,
    frame_rate: float,
) -> tuple[list[ScannedImage], list[str], list[Path], tuple[Path, ...]]:
    """The clips of video subset ``s`` as samples, the problems of the videos left out (only
    with ``skip_bad``; otherwise raised), the videos too short for any clip and the folder's
    entries that are neither videos nor captions."""
    options = ClipOptions.from_subset(subset)
    root_of = _CacheRoots(subset, cache_dir)
    keys = _Keys(s, subset.video_directory or str(Path(subset.video_jsonl_file).parent))
    found, skipped, short = [], [], []
    listing = video_items(subset)
    items = listing.items
    names = [keys(item.path) for item in items]
    headers = probe_all([item.path for item in items], scan_index, names)
    for item, key, header in zip(items, names, headers, strict=True):
        try:
            if isinstance(header, DataError):
                raise header
            bucket = bucket_of(header.size)
        except (DataError, ValueError) as error:
            problem = str(error) if isinstance(error, DataError) else f"video {item.path}: {error}"
            if not skip_bad:
                raise DataError(f"{problem} (or set skip_bad_images = true)") from None
            skipped.append(problem)
            continue
        clips = clip_frames(header, options, frame_rate)
        if not clips:
            short.append(item.path)
        root = root_of(item.path)
        found += [
            ScannedImage(item, s, header.size, bucket, f"{key}@{c[0]}+{len(c)}", root, (), c)
            for c in clips
        ]
    return found, skipped, short, listing.ignored


def _options(index: int, config: DatasetConfig) -> tuple[SubsetOptions, ...]:
    options = []
    for j, subset in enumerate(config.subsets):
        try:
            options.append(subset_options(subset))
        except ValueError as error:  # option combinations the field checks cannot see
            raise ConfigError(f"datasets[{index}].subsets[{j}]: {error}") from None
    return tuple(options)


def _hold_out(images: list[ScannedImage], config: DatasetConfig, seed: int) -> tuple[list, list]:
    """Split the non-reg images into training and validation (reg images always train); a
    video's clips are held out together (ScannedImage.split_key)."""
    if not config.held_out:
        return images, []
    candidates = [i for i, image in enumerate(images) if not image.item.is_reg]
    split_seed = config.validation_seed if config.validation_seed is not None else seed
    units = list(dict.fromkeys(images[i].split_key for i in candidates))
    chosen = validation_indices(units, config.validation_split, split_seed)
    held_units = {units[c] for c in chosen}
    held = {i for i in candidates if images[i].split_key in held_units}
    return (
        [image for i, image in enumerate(images) if i not in held],
        [image for i, image in enumerate(images) if i in held],
    )
