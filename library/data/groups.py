"""The training data's bucket groups, and what the data plan and the sample readers read of the
training data (library.data.dataset.TrainData builds on both, so they do not import it)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from library.data.items import ScannedDataset
from library.data.schedule import EpochSchedule, SampleSpec


@dataclass(frozen=True)
class Group:
    """The samples of one bucket of one dataset: a "dataset" of the epoch schedule, so every
    optimizer step holds images of one size."""

    dataset: int
    bucket: tuple[int, int]  # (width, height)
    samples: tuple[SampleSpec, ...]  # .item indexes the dataset's images
    # (width, height) of each of its samples' reference images (edit models), () for none
    references: tuple[tuple[int, int], ...] = ()
    frames: int = 1  # frames of each of its samples: a video dataset's clips have more than 1


class ScannedData(Protocol):
    """The training data as the data plan (library.data.plan) and the sample readers
    (library.data.samples) read it: every dataset scanned, its bucket groups and the epoch
    schedule (library.data.dataset.TrainData)."""

    seed: int
    scanned: tuple[ScannedDataset, ...]
    groups: tuple[Group, ...]
    schedule: EpochSchedule
    # the denoiser's sequence length of one sample of a bucket size (W, H) and frame count, from
    # the model's family (ModelFamily.tokens_per_sample); None where no family is known
    tokens_of: Callable[[tuple[int, int], int], int] | None

    @property
    def num_train_images(self) -> int: ...

    @property
    def num_reg_images(self) -> int: ...

    @property
    def repeated_train_images(self) -> int: ...

    @property
    def repeated_reg_images(self) -> int: ...

    @property
    def num_validation_images(self) -> int: ...

    def tag_frequency(self) -> dict[str, dict[str, int]]: ...

    def dataset_dirs(self) -> dict[str, dict[str, int]]: ...
