"""The data part of the training plan: numbers per dataset and the lines printed before training."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from library.data.groups import ScannedData
from library.data.items import ScannedDataset
from library.errors import ConfigError


@dataclass(frozen=True)
class SubsetStats:
    image_dir: str  # or the metadata file of a metadata subset, or a video subset's source
    images: int  # used for training (held-out validation images not counted); a video
    # subset's clips
    num_repeats: int
    is_reg: bool
    samples_per_epoch: int  # reg: after balancing to the dataset's train samples
    unused_images: int  # reg images that balancing leaves out of every epoch
    # edit models: the reference images of its images, where they come from and how they are
    # sized (library.data.references)
    reference_images: int = 0
    references_from: str | None = None  # the control_directory, or the metadata file
    reference_sizing: str | None = None
    videos: int = 0  # a video subset's videos that give clips (0: an image subset)


@dataclass(frozen=True)
class BucketStats:
    size: tuple[int, int]  # (width, height)
    images: int
    samples_per_epoch: int
    steps_per_epoch: int
    padded_per_epoch: int  # padding slots (loss weight 0) filling its last step
    references: tuple[tuple[int, int], ...] = ()  # its samples' reference sizes (edit models)
    frames: int = 1  # frames of each sample: clips of a video dataset have more
    tokens: int | None = None  # the denoiser's sequence length per sample (None: not known)


@dataclass(frozen=True)
class DatasetStats:
    resolution: tuple[int, int]  # (width, height)
    batch_size: int  # per process and micro-batch
    step_size: int  # samples per optimizer step: batch_size x accumulation x world_size
    subsets: tuple[SubsetStats, ...]
    train_images: int
    reg_images: int
    samples_per_epoch: int  # before padding
    padded_per_epoch: int  # padding slots filling each bucket's last step
    steps_per_epoch: int  # optimizer steps
    micro_batches_per_process: int  # per epoch
    buckets: tuple[BucketStats, ...] = ()
    enable_bucket: bool = False
    bucketing: str = "kohya"  # whose bucket rule (library.data.buckets)
    validation_images: int = 0
    skipped_images: int = 0
    animated_images: tuple[str, ...] = ()  # short names; their first frame is trained
    ignored_files: tuple[str, ...] = ()  # short names of folder entries that are not images
    unlisted_images: tuple[str, ...] = ()  # short names of images a metadata file leaves out
    uncaptioned_images: int = 0  # no caption file, no class_tokens: trained with ""
    short_videos: tuple[str, ...] = ()  # short names of videos shorter than every clip length


@dataclass(frozen=True)
class DataStats:
    datasets: tuple[DatasetStats, ...]
    accumulation: int
    world_size: int
    train_images: int  # image files
    reg_images: int
    samples_per_epoch: int
    padded_per_epoch: int
    steps_per_epoch: int
    micro_batches_per_process: int  # per epoch
    num_train_images: int  # kohya's ss_num_train_images: train images x their repeats
    num_reg_images: int  # kohya's ss_num_reg_images: reg images x their repeats, unbalanced
    tag_frequency: dict[str, dict[str, int]] = field(default_factory=dict)  # ss_tag_frequency
    dataset_dirs: dict[str, dict[str, int]] = field(default_factory=dict)  # ss_dataset_dirs
    validation_images: int = 0
    skipped: tuple[str, ...] = ()  # unreadable images left out (skip_bad_images), with reasons
    scan: ScanStats | None = None  # the scan of the image files (None: not measured)


@dataclass(frozen=True)
class ScanStats:
    """The scan of every dataset's files: how long it took (on the process that read them)."""

    seconds: float
    images: int  # image files checked (usable ones; unreadable ones left out are not counted)
    from_index: int  # of which the scan index answered, the file unchanged since

    def line(self) -> str:
        indexed = f"; {self.from_index} unchanged, from the scan index" if self.from_index else ""
        return f"data scan: {self.images} images checked in {self.seconds:.1f} s{indexed}"


def _subset_stats(data: ScannedData, d: int) -> list[SubsetStats]:
    scanned = data.scanned[d]
    samples = Counter()
    for group in data.groups:
        if group.dataset == d:
            samples.update(scanned.images[s.item].subset for s in group.samples)
    used = {s.item for g in data.groups if g.dataset == d for s in g.samples}
    subsets = []
    for j, config in enumerate(scanned.config.subsets):
        members = [i for i, image in enumerate(scanned.images) if image.subset == j]
        references = sum(len(scanned.images[i].references) for i in members)
        videos = len({scanned.images[i].item.path for i in members}) if config.is_video else 0
        subsets.append(
            SubsetStats(
                config.source,
                len(members),
                config.num_repeats,
                config.is_reg,
                samples[j],
                sum(i not in used for i in members),
                references,
                (config.control_directory or config.metadata_file) if references else None,
                _sizing_text(config) if references else None,
                videos,
            )
        )
    return subsets


def _sizing_text(config) -> str:
    """How a subset sizes its reference images, in words."""
    if config.no_resize_control:
        limit = config.control_resolution
        cap = f" up to {limit[0]}x{limit[1]}'s area" if limit else ""
        return f"at their own size{cap}"
    if config.control_resolution is not None:
        width, height = config.control_resolution
        return f"bucketed at the area of {width}x{height}"
    return "resized to their image's bucket"


def _bucket_stats(data: ScannedData, d: int) -> list[BucketStats]:
    schedule = data.schedule
    tokens_of = data.tokens_of
    return [
        BucketStats(
            group.bucket,
            len({s.item for s in group.samples}),
            len(group.samples),
            schedule.dataset_steps(g),
            schedule.dataset_padding(g),
            group.references,
            group.frames,
            None if tokens_of is None else tokens_of(group.bucket, group.frames),
        )
        for g, group in enumerate(data.groups)
        if group.dataset == d
    ]


def short_name(path: Path) -> str:
    """ "<folder>/<name>" of a path: enough to find a file among a dataset's subsets."""
    return f"{path.parent.name}/{path.name}" + ("/" if path.is_dir() else "")


def _left_out_stats(scanned: ScannedDataset) -> dict:
    """The DatasetStats fields about images and files not trained as they are."""
    everything = scanned.images + scanned.validation
    return {
        "animated_images": tuple(short_name(p) for p in scanned.animated),
        "ignored_files": tuple(short_name(p) for p in scanned.ignored),
        "unlisted_images": tuple(short_name(p) for p in scanned.unlisted),
        # Empty caption files and captions are errors, so "" means the image has no caption.
        "uncaptioned_images": sum(image.item.caption == "" for image in everything),
        "short_videos": tuple(short_name(p) for p in scanned.short_videos),
    }


def data_stats(data: ScannedData) -> DataStats:
    """The numbers of the data plan, from the scanned data and its schedule."""
    schedule = data.schedule
    datasets = []
    for d, scanned in enumerate(data.scanned):
        subsets = _subset_stats(data, d)
        buckets = _bucket_stats(data, d)
        config = scanned.config
        width, height = config.resolution
        steps = sum(b.steps_per_epoch for b in buckets)
        datasets.append(
            DatasetStats(
                resolution=(width, height),
                batch_size=config.batch_size,
                step_size=config.batch_size * schedule.accumulation * schedule.world_size,
                subsets=tuple(subsets),
                train_images=sum(s.images for s in subsets if not s.is_reg),
                reg_images=sum(s.images for s in subsets if s.is_reg),
                samples_per_epoch=sum(b.samples_per_epoch for b in buckets),
                padded_per_epoch=sum(b.padded_per_epoch for b in buckets),
                steps_per_epoch=steps,
                micro_batches_per_process=steps * schedule.accumulation,
                buckets=tuple(buckets),
                enable_bucket=config.enable_bucket,
                bucketing=config.bucketing,
                validation_images=len(scanned.validation),
                skipped_images=len(scanned.skipped),
                **_left_out_stats(scanned),
            )
        )
    return DataStats(
        datasets=tuple(datasets),
        accumulation=schedule.accumulation,
        world_size=schedule.world_size,
        train_images=data.num_train_images,
        reg_images=data.num_reg_images,
        samples_per_epoch=schedule.samples_per_epoch,
        padded_per_epoch=schedule.padded_per_epoch,
        steps_per_epoch=schedule.steps_per_epoch,
        micro_batches_per_process=schedule.steps_per_epoch * schedule.accumulation,
        num_train_images=data.repeated_train_images,
        num_reg_images=data.repeated_reg_images,
        tag_frequency=data.tag_frequency(),
        dataset_dirs=data.dataset_dirs(),
        validation_images=data.num_validation_images,
        skipped=data.skipped_images,
        scan=ScanStats(
            round(data.scan_seconds, 2),
            sum(len(s.images) + len(s.validation) for s in data.scanned),
            sum(s.indexed for s in data.scanned),
        ),
    )


def check_batch_sizes(stats: DataStats) -> None:
    """Refuse a dataset whose micro-batch is larger than its samples per epoch: every batch
    would repeat the same images as padding, which is never what was meant."""
    for d, ds in enumerate(stats.datasets):
        if ds.batch_size > ds.samples_per_epoch:
            raise ConfigError(
                f"dataset {d} has {ds.samples_per_epoch} samples per epoch (images x num_repeats, "
                f"regularisation images included) but batch_size = {ds.batch_size}; set "
                f"train_batch_size (or datasets[{d}].batch_size) to {ds.samples_per_epoch} or "
                "less, or raise num_repeats"
            )


def _subset_line(subset: SubsetStats) -> str:
    repeats = f"{subset.num_repeats} repeat{'s' if subset.num_repeats != 1 else ''}"
    references = (
        f", {subset.reference_images} reference images from {subset.references_from} "
        f"({subset.reference_sizing})"
        if subset.reference_images
        else ""
    )
    if subset.videos:
        kind = " (reg)" if subset.is_reg else ""
        clips = f"{subset.images} clips from {subset.videos} videos"
        return f"  {subset.image_dir}{kind}: {clips} x {repeats}"
    if not subset.is_reg:
        return f"  {subset.image_dir}: {subset.images} images x {repeats}{references}"
    line = (
        f"  {subset.image_dir} (reg): {subset.images} images x {repeats}, "
        f"balanced to {subset.samples_per_epoch} samples per epoch{references}"
    )
    if subset.unused_images:
        line += f" ({subset.unused_images} images unused)"
    return line


def _sizes(sizes: tuple[tuple[int, int], ...]) -> str:
    return ", ".join(f"{width}x{height}" for width, height in sizes)


MAX_BUCKET_LINES = 24  # bucket_no_upscale can make hundreds of buckets; list the largest


def _bucket_lines(ds: DatasetStats) -> list[str]:
    """The bucket histogram: one line per bucket (size, and frame count where a dataset has
    clips), with a bar scaled to the largest bucket."""
    clips = any(b.frames > 1 for b in ds.buckets)
    if not ds.enable_bucket and not clips:
        return []
    most = max(b.samples_per_epoch for b in ds.buckets)
    shown = ds.buckets
    if len(shown) > MAX_BUCKET_LINES:
        largest = sorted(shown, key=lambda b: -b.samples_per_epoch)[: MAX_BUCKET_LINES - 4]
        shown = tuple(b for b in ds.buckets if b in largest)
    rule = "musubi-tuner's rule; " if ds.bucketing == "musubi" else ""
    shape = "width x height x frames" if clips else "width x height"
    tokens = ", tokens per sample" if any(b.tokens is not None for b in ds.buckets) else ""
    lines = [
        f"  {len(ds.buckets)} buckets ({rule}{shape}: images, samples per epoch, steps{tokens}):"
    ]
    for b in shown:
        bar = "#" * max(1, round(20 * b.samples_per_epoch / most))
        frames = f"x{b.frames:<3}" if clips else ""
        unit = "clips " if b.frames > 1 else "images"
        line = (
            f"    {b.size[0]:>4}x{b.size[1]:<4}{frames} {b.images:>5} {unit} "
            f"{b.samples_per_epoch:>6} samples {b.steps_per_epoch:>4} steps {bar}"
        )
        if b.tokens is not None:
            line += f"  {b.tokens} tokens"
        if b.references:
            line += f"  references {_sizes(b.references)}"
        if b.samples_per_epoch < ds.step_size:
            line += f"  (smaller than a step: {b.padded_per_epoch} padding slots)"
        lines.append(line)
    rest = [b for b in ds.buckets if b not in shown]
    if rest:
        small = sum(b.samples_per_epoch < ds.step_size for b in rest)
        lines.append(
            f"    ... {len(rest)} more buckets with {sum(b.images for b in rest)} images "
            f"({small} of them smaller than a step)"
        )
    return lines


def _tokens_line(ds: DatasetStats) -> list[str]:
    """The denoiser's sequence length per sample, for a dataset without bucket lines."""
    tokens = sorted({b.tokens for b in ds.buckets if b.tokens is not None})
    if not tokens:
        return []
    return [f"  {', '.join(str(t) for t in tokens)} tokens per sample (the denoiser's sequence)"]


def _padding_line(ds: DatasetStats) -> str:
    where = "each bucket's" if ds.enable_bucket else "the"
    return (
        f"  {ds.padded_per_epoch} padding slots fill {where} last step: they repeat samples with "
        "loss weight 0, so every image still counts exactly its repeats"
    )


MAX_NAMES = 5  # file names listed in one plan line


def _listed(names: tuple[str, ...]) -> str:
    shown = list(names[:MAX_NAMES]) + (["..."] if len(names) > MAX_NAMES else [])
    return ", ".join(shown)


def _left_out_lines(ds: DatasetStats) -> list[str]:
    """What the plan says about images and files that are not trained as they are."""
    lines = []
    if ds.skipped_images:
        lines.append(f"  {ds.skipped_images} unreadable images left out (skip_bad_images)")
    if ds.animated_images:
        lines.append(
            f"  {len(ds.animated_images)} animated images: first frame used "
            f"({_listed(ds.animated_images)})"
        )
    if ds.uncaptioned_images:
        lines.append(
            f"  {ds.uncaptioned_images} images have no caption file and no class_tokens: trained "
            "with an empty caption (unconditional)"
        )
    if ds.ignored_files:
        lines.append(
            f"  {len(ds.ignored_files)} files that are not training images were ignored: "
            f"{_listed(ds.ignored_files)}"
        )
    if ds.short_videos:
        lines.append(
            f"  {len(ds.short_videos)} videos are shorter than every clip length (target_frames) "
            f"and give no clip: {_listed(ds.short_videos)}"
        )
    if ds.unlisted_images:
        lines.append(
            f"  {len(ds.unlisted_images)} images are not listed in their metadata file and were "
            f"ignored: {_listed(ds.unlisted_images)}"
        )
    return lines


class _Planned(Protocol):
    """The training data with its numbers (library.data.dataset.TrainData)."""

    @property
    def stats(self) -> DataStats: ...


def plan_lines(data: _Planned | DataStats) -> list[str]:
    """Human-readable lines describing each dataset and its share of an epoch."""
    stats = data if isinstance(data, DataStats) else data.stats
    lines = []
    for d, ds in enumerate(stats.datasets):
        lines.append(
            f"dataset {d}: resolution {ds.resolution[0]}x{ds.resolution[1]}, "
            f"batch size {ds.batch_size} per process, {ds.step_size} samples per optimizer step"
        )
        lines.extend(_subset_line(subset) for subset in ds.subsets)
        lines.append(
            f"  {ds.train_images} train images, {ds.reg_images} reg images, "
            f"{ds.samples_per_epoch} samples per epoch"
        )
        if ds.validation_images:
            lines.append(f"  {ds.validation_images} images held out for validation")
        lines.extend(_left_out_lines(ds))
        buckets = _bucket_lines(ds)
        lines.extend(buckets or _tokens_line(ds))
        if ds.padded_per_epoch:
            lines.append(_padding_line(ds))
        lines.append(
            f"  {ds.steps_per_epoch} optimizer steps per epoch, "
            f"{ds.micro_batches_per_process} micro-batches per epoch per process"
        )
    if len(stats.datasets) > 1:
        lines.append(
            f"all datasets: {stats.samples_per_epoch} samples + {stats.padded_per_epoch} padding "
            f"= {stats.steps_per_epoch} optimizer steps per epoch"
        )
    if stats.scan is not None:
        lines.append(stats.scan.line())
    return lines
