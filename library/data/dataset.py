"""The training data: scanned datasets, their bucket groups, the epoch schedule and the loaders."""

from __future__ import annotations

import gc
import os
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from functools import cached_property

from torch.utils.data import DataLoader

from library.config.dataset_schema import DatasetConfig
from library.data.cache_group import CacheGroup, broadcast_or_raise
from library.data.clips import MODEL_FPS
from library.data.groups import Group
from library.data.items import ScannedDataset, scan_dataset
from library.data.notes import dataset_warnings
from library.data.plan import DataStats, data_stats
from library.data.samples import SampleSource, TrainSamples, ValidationSamples, collate
from library.data.schedule import EpochSchedule, SampleSpec, epoch_samples
from library.errors import ConfigError

# The most samples one dataset's epoch may hold (images x num_repeats): far beyond a real
# dataset, and a bound before the epoch's sample list is built (num_repeats = 1e9 would be
# billions of entries).
MAX_EPOCH_SAMPLES = 10_000_000


def _groups(d: int, scanned: ScannedDataset, prior_loss_weight: float) -> list[Group]:
    repeats = [
        (scanned.config.subsets[image.subset].num_repeats, image.item.is_reg)
        for image in scanned.images
    ]
    _check_epoch_size(d, scanned, sum(r for r, reg in repeats if not reg))
    samples = epoch_samples(repeats, prior_loss_weight)
    keys = [image.group_key for image in scanned.images]
    by_key: dict[tuple, list[SampleSpec]] = {}
    for sample in samples:
        by_key.setdefault(keys[sample.item], []).append(sample)
    return [Group(d, key[0], tuple(by_key[key]), key[1], key[2]) for key in sorted(by_key)]


def _check_epoch_size(d: int, scanned: ScannedDataset, samples: int) -> None:
    """ConfigError naming the subset with the most repeats when the epoch would hold more than
    MAX_EPOCH_SAMPLES samples (regularisation images add as many again at most)."""
    if samples <= MAX_EPOCH_SAMPLES:
        return
    subsets = scanned.config.subsets
    j = max(range(len(subsets)), key=lambda i: subsets[i].num_repeats)
    folder = subsets[j].source
    raise ConfigError(
        f"datasets[{d}] would hold {samples:,} samples per epoch (images x num_repeats), more "
        f"than difftune takes ({MAX_EPOCH_SAMPLES:,}); lower datasets[{d}].subsets[{j}]."
        f"num_repeats = {subsets[j].num_repeats} ({folder})"
    )


@contextmanager
def _without_cycle_collection() -> Iterator[None]:
    """The cyclic garbage collector off while the records of a dataset are made: they hold no
    cycles, and with millions of them each collection would walk them all again (a third of a
    scan's time at 20,000 images)."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


class TrainData:
    """Every dataset scanned and checked, in bucket groups, with the epoch schedule for this
    process layout, and the validation images held out.

    Building it reads every caption file and checks every image header, so a bad file stops the
    run before training starts (or, with ``skip_bad_images``, is left out and counted). A scan
    index (library.data.scan_index) answers for the files unchanged since the last run where a
    cache folder is set (``cache_dir``, a subset's cache_directory) or ``keep_scan_index``.
    With a ``group`` of several processes only its rank 0 reads the files and the others
    receive the result. ``scan_seconds``: how long that took (here). ``frame_rate``: the
    model's, which a video subset's source_fps resamples its videos to.
    """

    def __init__(
        self,
        datasets: Sequence[DatasetConfig],
        seed: int,
        accumulation: int = 1,
        world_size: int = 1,
        prior_loss_weight: float = 1.0,
        skip_bad_images: bool = False,
        cache_dir: str | None = None,
        keep_scan_index: bool = False,
        group: CacheGroup | None = None,
        frame_rate: float = MODEL_FPS,
        tokens_of: Callable[[tuple[int, int], int], int] | None = None,
    ) -> None:
        self.seed = seed
        self.tokens_of = tokens_of  # the plan's tokens per sample (ScannedData.tokens_of)
        self.world_size = world_size

        def scan() -> tuple[ScannedDataset, ...]:
            return tuple(
                scan_dataset(
                    i, config, seed, skip_bad_images, cache_dir, keep_scan_index, frame_rate
                )
                for i, config in enumerate(datasets)
            )

        started = time.perf_counter()
        with _without_cycle_collection():
            if group is None or group.world_size == 1:
                self.scanned = scan()
            else:  # one process reads the files, the others receive what it found
                self.scanned = broadcast_or_raise(group, scan, "scanning the datasets")
            self.scan_seconds = time.perf_counter() - started
            self.groups = tuple(
                group
                for d, scanned in enumerate(self.scanned)
                for group in _groups(d, scanned, prior_loss_weight)
            )
        self.schedule = EpochSchedule(
            [g.samples for g in self.groups],
            [self.scanned[g.dataset].config.batch_size for g in self.groups],
            accumulation=accumulation,
            world_size=world_size,
            seed=seed,
        )

    @cached_property
    def stats(self) -> DataStats:
        """The numbers of the data plan and of the kohya metadata (see plan.DataStats)."""
        return data_stats(self)

    def _counts(self, reg: bool) -> list[tuple[int, int]]:
        """(images used for training, repeats) per subset of the given kind."""
        counts = []
        for scanned in self.scanned:
            per_subset = Counter(image.subset for image in scanned.images)
            counts += [
                (per_subset[j], subset.num_repeats)
                for j, subset in enumerate(scanned.config.subsets)
                if subset.is_reg == reg
            ]
        return counts

    @property
    def num_train_images(self) -> int:
        """Training image files (each counted once; held-out validation images are not)."""
        return sum(count for count, _ in self._counts(False))

    @property
    def num_reg_images(self) -> int:
        """Regularisation image files (each counted once)."""
        return sum(count for count, _ in self._counts(True))

    @property
    def repeated_train_images(self) -> int:
        """Training images times their repeats: what kohya writes as ss_num_train_images."""
        return sum(count * repeats for count, repeats in self._counts(False))

    @property
    def repeated_reg_images(self) -> int:
        """Reg images times their repeats, before balancing: kohya's ss_num_reg_images."""
        return sum(count * repeats for count, repeats in self._counts(True))

    @property
    def num_validation_images(self) -> int:
        """Images held out for the validation loss."""
        return sum(len(s.validation) for s in self.scanned)

    @cached_property
    def warnings(self) -> tuple[str, ...]:
        """Images that train, but not as their files look (library.data.notes): one line each
        kind per dataset, without "warning: "."""
        return tuple(
            line for d, scanned in enumerate(self.scanned) for line in dataset_warnings(d, scanned)
        )

    @property
    def skipped_images(self) -> tuple[str, ...]:
        """Unreadable images left out under skip_bad_images, with the reason."""
        return tuple(problem for s in self.scanned for problem in s.skipped)

    def tag_frequency(self) -> dict[str, dict[str, int]]:
        """Folder name -> tag -> images whose caption has it (ss_tag_frequency).

        Tags are the caption split on commas and stripped; each image counts once, whatever its
        repeats. Subsets whose folders share a name are counted together.
        """
        tags: dict[str, list[str]] = {}  # folder name -> every tag of its images, empty ones too
        names: dict[str, str] = {}  # subset folder -> its name
        for image in (image for scanned in self.scanned for image in scanned.images):
            folder = image.item.subset_dir
            name = names.get(folder) or names.setdefault(folder, os.path.basename(folder))
            caption = image.item.caption.partition("\n")[0]
            tags.setdefault(name, []).extend(map(str.strip, caption.split(",")))
        frequency = {name: Counter(found) for name, found in tags.items()}
        return {
            name: {t: n for t, n in counter.items() if t} for name, counter in frequency.items()
        }

    def dataset_dirs(self) -> dict[str, dict[str, int]]:
        """Folder name -> {"n_repeats", "img_count"} (ss_dataset_dirs); same-name folders add
        their image counts and keep the first one's repeats."""
        dirs: dict[str, dict[str, int]] = {}
        for scanned in self.scanned:
            for j, subset in enumerate(scanned.config.subsets):
                name = os.path.basename(subset.source)
                entry = dirs.setdefault(name, {"n_repeats": subset.num_repeats, "img_count": 0})
                entry["img_count"] += sum(1 for image in scanned.images if image.subset == j)
        return dirs

    def loader(
        self,
        epoch: int,
        rank: int,
        start_step: int = 0,
        num_workers: int = 0,
        persistent_workers: bool = False,
        source: SampleSource | None = None,
        epochs: int = 1,
    ) -> DataLoader:
        """This rank's micro-batches of `epochs` epochs from `epoch` (the first from its
        optimizer step `start_step`), in order, from one loader: its workers load across the
        epoch boundaries instead of starting again for each epoch.

        Each batch (see library.data.samples.collate): "pixel_values" float [B, 3, H, W] in
        [-1, 1] ([B, 3, F, H, W] for clips of F frames), or with a latent cache
        "latent_means"/"latent_stds" in the latent codec's layout ([B, C, h, w] for an image
        VAE) and, for a family whose first frame conditions it, "first_frame_means" (the
        posterior mean of each sample's first frame followed by zeros); "captions" (after
        caption processing);
        "loss_weights" float [B] (0 for padding samples); "positions" long [B]; "epoch";
        "cache_roots"; "alpha_masks" [B, 1, H, W] when a subset
        has alpha_mask; SDXL's "original_sizes", "crop_top_lefts", "target_sizes" long [B, 2];
        "readable" bool [B] and "unreadable", the problems of the images that could not be
        read now (their samples are stand-ins with loss weight 0, see library.data.samples).
        The order is fixed by the schedule and every random choice is keyed by (seed,
        epoch, position), so workers and process layouts cannot change the results.
        """
        source = source or SampleSource()
        return DataLoader(
            TrainSamples(self, source),
            batch_sampler=EpochBatches(self.schedule, rank, epoch, epochs, start_step),
            num_workers=num_workers,
            persistent_workers=persistent_workers and num_workers > 0,
            collate_fn=collate,
        )

    def validation_chunks(self) -> list[list[tuple[int, int]]]:
        """Every validation batch as (dataset, image index in its validation list) pairs: per
        dataset and bucket (and reference sizes; sorted), in chunks of the dataset's batch
        size."""
        chunks = []
        for d, scanned in enumerate(self.scanned):
            by_bucket: dict[tuple, list[int]] = {}
            for i, image in enumerate(scanned.validation):
                by_bucket.setdefault(image.group_key, []).append(i)
            size = scanned.config.batch_size
            for bucket in sorted(by_bucket):
                indices = by_bucket[bucket]
                chunks += [
                    [(d, i) for i in indices[c : c + size]] for c in range(0, len(indices), size)
                ]
        return chunks

    def validation_loader(
        self, rank: int, source: SampleSource | None = None, max_batches: int | None = None
    ) -> DataLoader:
        """This rank's share of the validation batches (every world_size-th chunk), at most
        `max_batches`. Batches are like the training ones plus "validation_keys"."""
        chunks = self.validation_chunks()[rank :: self.world_size][:max_batches]
        return DataLoader(
            ValidationSamples(self, source or SampleSource()),
            batch_sampler=chunks,
            collate_fn=collate,
        )


class EpochBatches:
    """The batch sampler of TrainData.loader: rank `rank`'s micro-batches of each epoch from
    `first` on (the first from optimizer step `start_step`) as lists of (epoch, SampleRef),
    each epoch's schedule made when the loader reaches it."""

    def __init__(self, schedule, rank: int, first: int, epochs: int, start_step: int = 0):
        self.schedule, self.rank, self.first, self.epochs = schedule, rank, first, epochs
        # the first epoch's batches now: a bad rank or start step is an error here, not later
        self.opening = schedule.micro_batches(first, rank, start_step)

    def __iter__(self):
        for epoch in range(self.first, self.first + self.epochs):
            batches = (
                self.opening
                if epoch == self.first
                else self.schedule.micro_batches(epoch, self.rank)
            )
            for batch in batches:
                yield [(epoch, ref) for ref in batch]
