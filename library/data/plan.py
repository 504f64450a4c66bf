"""The data part of the training plan: numbers per dataset and the lines printed before training."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # dataset.py imports this module for TrainData.stats
    from library.data.dataset import TrainData


@dataclass(frozen=True)
class SubsetStats:
    image_dir: str
    images: int
    num_repeats: int
    is_reg: bool
    samples_per_epoch: int  # reg: after balancing to the dataset's train samples
    unused_images: int  # reg images that balancing leaves out of every epoch


@dataclass(frozen=True)
class DatasetStats:
    resolution: tuple[int, int]  # (width, height)
    batch_size: int  # per process and micro-batch
    step_size: int  # samples per optimizer step: batch_size x accumulation x world_size
    subsets: tuple[SubsetStats, ...]
    train_images: int
    reg_images: int
    samples_per_epoch: int  # before padding
    padded_per_epoch: int  # samples repeated to fill the last step
    steps_per_epoch: int  # optimizer steps
    micro_batches_per_process: int  # per epoch


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


def data_stats(data: TrainData) -> DataStats:
    """The numbers of the data plan, from the scanned data and its schedule."""
    schedule = data.schedule
    datasets = []
    for d, dataset in enumerate(data.datasets):
        used = {sample.item for sample in dataset.samples}
        subsets, start = [], 0
        for subset in dataset.subsets:
            unused = sum(i not in used for i in range(start, start + len(subset.items)))
            start += len(subset.items)
            config = subset.config
            subsets.append(
                SubsetStats(
                    config.image_dir,
                    len(subset.items),
                    config.num_repeats,
                    config.is_reg,
                    subset.samples_per_epoch,
                    unused,
                )
            )
        width, height = dataset.config.resolution
        datasets.append(
            DatasetStats(
                resolution=(width, height),
                batch_size=dataset.config.batch_size,
                step_size=schedule.step_sizes[d],
                subsets=tuple(subsets),
                train_images=sum(s.images for s in subsets if not s.is_reg),
                reg_images=sum(s.images for s in subsets if s.is_reg),
                samples_per_epoch=len(dataset.samples),
                padded_per_epoch=schedule.dataset_padding(d),
                steps_per_epoch=schedule.dataset_steps(d),
                micro_batches_per_process=schedule.dataset_steps(d) * schedule.accumulation,
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
    )


def _subset_line(subset: SubsetStats) -> str:
    repeats = f"{subset.num_repeats} repeat{'s' if subset.num_repeats != 1 else ''}"
    if not subset.is_reg:
        return f"  {subset.image_dir}: {subset.images} images x {repeats}"
    line = (
        f"  {subset.image_dir} (reg): {subset.images} images x {repeats}, "
        f"balanced to {subset.samples_per_epoch} samples per epoch"
    )
    if subset.unused_images:
        line += f" ({subset.unused_images} images unused)"
    return line


def plan_lines(data: TrainData | DataStats) -> list[str]:
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
        if ds.padded_per_epoch:
            lines.append(f"  {ds.padded_per_epoch} samples repeated to fill the last step")
        lines.append(
            f"  {ds.steps_per_epoch} optimizer steps per epoch, "
            f"{ds.micro_batches_per_process} micro-batches per epoch per process"
        )
    if len(stats.datasets) > 1:
        lines.append(
            f"all datasets: {stats.samples_per_epoch} samples + {stats.padded_per_epoch} repeated "
            f"= {stats.steps_per_epoch} optimizer steps per epoch"
        )
    return lines
