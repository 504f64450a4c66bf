"""The training data: scanned subsets, their epoch samples, the schedule and the data loader."""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property

import torch
from torch.utils.data import DataLoader, Dataset

from library.config.dataset_schema import DatasetConfig, SubsetConfig
from library.data.folders import ImageItem, caption_for, scan_subset
from library.data.images import check_image, load_image_with_sizes
from library.data.plan import DataStats, data_stats
from library.data.schedule import EpochSchedule, SampleRef, SampleSpec, epoch_samples
from library.errors import DataError


@dataclass(frozen=True)
class SubsetData:
    """A scanned subset: its config, its images and the samples it gives per epoch."""

    config: SubsetConfig
    items: tuple[ImageItem, ...]
    samples_per_epoch: int  # reg subsets: after balancing to the train sample count


@dataclass(frozen=True)
class DatasetData:
    """A scanned dataset: `samples[i].item` indexes `items` (the subsets' items in order)."""

    config: DatasetConfig
    subsets: tuple[SubsetData, ...]
    items: tuple[ImageItem, ...]
    samples: tuple[SampleSpec, ...]


def _build_dataset(index: int, config: DatasetConfig, prior_loss_weight: float) -> DatasetData:
    scanned = [scan_subset(subset) for subset in config.subsets]
    if all(subset.is_reg for subset in config.subsets):
        raise DataError(
            f"dataset {index} has only regularisation subsets (is_reg = true); add a subset of "
            "training images"
        )
    for item in (item for items in scanned for item in items):
        check_image(item.path)
    items = [item for items in scanned for item in items]
    pairs = zip(config.subsets, scanned, strict=True)
    repeats = [(subset.num_repeats, subset.is_reg) for subset, found in pairs for _ in found]
    samples = epoch_samples(repeats, prior_loss_weight)
    per_item = Counter(sample.item for sample in samples)
    subsets, start = [], 0
    for subset, found in zip(config.subsets, scanned, strict=True):
        count = sum(per_item[i] for i in range(start, start + len(found)))
        subsets.append(SubsetData(subset, tuple(found), count))
        start += len(found)
    return DatasetData(config, tuple(subsets), tuple(items), tuple(samples))


class TrainData:
    """Every dataset scanned and checked, with the epoch schedule for this process layout.

    Building it reads every caption file and checks every image header, so a bad file stops the
    run before training starts.
    """

    def __init__(
        self,
        datasets: Sequence[DatasetConfig],
        seed: int,
        accumulation: int = 1,
        world_size: int = 1,
        prior_loss_weight: float = 1.0,
    ) -> None:
        self.datasets = tuple(
            _build_dataset(i, config, prior_loss_weight) for i, config in enumerate(datasets)
        )
        self.schedule = EpochSchedule(
            [d.samples for d in self.datasets],
            [d.config.batch_size for d in self.datasets],
            accumulation=accumulation,
            world_size=world_size,
            seed=seed,
        )

    @cached_property
    def stats(self) -> DataStats:
        """The numbers of the data plan and of the kohya metadata (see plan.DataStats)."""
        return data_stats(self)

    def _subsets(self) -> list[SubsetData]:
        return [subset for dataset in self.datasets for subset in dataset.subsets]

    @property
    def num_train_images(self) -> int:
        """Training image files (each counted once)."""
        return sum(len(s.items) for s in self._subsets() if not s.config.is_reg)

    @property
    def num_reg_images(self) -> int:
        """Regularisation image files (each counted once)."""
        return sum(len(s.items) for s in self._subsets() if s.config.is_reg)

    @property
    def repeated_train_images(self) -> int:
        """Training images times their repeats: what kohya writes as ss_num_train_images."""
        return sum(
            len(s.items) * s.config.num_repeats for s in self._subsets() if not s.config.is_reg
        )

    @property
    def repeated_reg_images(self) -> int:
        """Reg images times their repeats, before balancing: kohya's ss_num_reg_images."""
        return sum(len(s.items) * s.config.num_repeats for s in self._subsets() if s.config.is_reg)

    def tag_frequency(self) -> dict[str, dict[str, int]]:
        """Folder name -> tag -> images whose caption has it (ss_tag_frequency).

        Tags are the caption split on commas and stripped; each image counts once, whatever its
        repeats. Subsets whose folders share a name are counted together.
        """
        frequency: dict[str, Counter[str]] = {}
        for subset in self._subsets():
            counter = frequency.setdefault(os.path.basename(subset.config.image_dir), Counter())
            for item in subset.items:
                counter.update(tag.strip() for tag in item.caption.split(",") if tag.strip())
        return {name: dict(counter) for name, counter in frequency.items()}

    def dataset_dirs(self) -> dict[str, dict[str, int]]:
        """Folder name -> {"n_repeats", "img_count"} (ss_dataset_dirs); same-name folders add
        their image counts and keep the first one's repeats."""
        dirs: dict[str, dict[str, int]] = {}
        for subset in self._subsets():
            name = os.path.basename(subset.config.image_dir)
            entry = dirs.setdefault(name, {"n_repeats": subset.config.num_repeats, "img_count": 0})
            entry["img_count"] += len(subset.items)
        return dirs

    def loader(
        self,
        epoch: int,
        rank: int,
        start_step: int = 0,
        num_workers: int = 0,
        persistent_workers: bool = False,
    ) -> DataLoader:
        """This rank's micro-batches of `epoch` from optimizer step `start_step`, in order.

        Each batch: {"pixel_values": float [B, 3, H, W] in [-1, 1], "captions": list[str],
        "loss_weights": float [B], "positions": long [B], "epoch": int, and for SDXL's size
        conditioning "original_sizes" (source image h, w), "crop_top_lefts" (crop top, left in
        the resized image, pixels), "target_sizes" (h, w), each long [B, 2]}. The order is fixed
        by the schedule; the loader holds no random state, so workers cannot change the results.
        """
        return DataLoader(
            _Samples(self.datasets, epoch),
            batch_sampler=self.schedule.micro_batches(epoch, rank, start_step),
            num_workers=num_workers,
            persistent_workers=persistent_workers and num_workers > 0,
            collate_fn=_collate,
        )


class _Samples(Dataset):
    """Map-style dataset indexed by SampleRef (the loader's batch_sampler yields lists of them)."""

    def __init__(self, datasets: tuple[DatasetData, ...], epoch: int) -> None:
        self.datasets = datasets
        self.epoch = epoch

    def __len__(self) -> int:
        return sum(len(d.samples) for d in self.datasets)

    def __getitem__(self, ref: SampleRef) -> dict:
        dataset = self.datasets[ref.dataset]
        spec = dataset.samples[ref.index]
        item = dataset.items[spec.item]
        width, height = dataset.config.resolution
        pixels, original, crop = load_image_with_sizes(item.path, (width, height))
        return {
            "pixel_values": pixels,
            "caption": caption_for(item, self.epoch, ref.position),
            "loss_weight": spec.loss_weight,
            "position": ref.position,
            "epoch": self.epoch,
            "original_size": original,
            "crop_top_left": crop,
            "target_size": (height, width),
        }


def _collate(samples: list[dict]) -> dict:
    return {
        "pixel_values": torch.stack([s["pixel_values"] for s in samples]),
        "captions": [s["caption"] for s in samples],
        "loss_weights": torch.tensor([s["loss_weight"] for s in samples], dtype=torch.float32),
        "positions": torch.tensor([s["position"] for s in samples], dtype=torch.long),
        "epoch": samples[0]["epoch"],
        "original_sizes": torch.tensor([s["original_size"] for s in samples], dtype=torch.long),
        "crop_top_lefts": torch.tensor([s["crop_top_left"] for s in samples], dtype=torch.long),
        "target_sizes": torch.tensor([s["target_size"] for s in samples], dtype=torch.long),
    }
