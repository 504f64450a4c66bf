"""The epoch schedule: which samples form each optimizer step, and which process and micro-batch
of that step each sample goes to.

The unit of scheduling is the optimizer step. A dataset's step holds B_eff = batch_size x
accumulation x world_size samples. For epoch e every dataset's samples are shuffled, cut into
steps of B_eff (the last step is filled by wrapping around to the dataset's first shuffled
samples, so every step is full and nothing is dropped), and the steps of all datasets are shuffled
together; one step never mixes datasets (resolutions). Each sample of the epoch gets a `position`,
its index in the flattened epoch order, which keys its per-sample randomness (noise, timestep).

Layout invariance: the shuffles depend only on (seed, epoch) and the sample lists, and the cut
only on B_eff. So runs with the same seed and the same B_eff per dataset see identical steps:
step k holds the same samples with the same positions whether it is run as 2 processes x
accumulation 2 x batch 1 or 1 process x batch 4. Only the split of a step into micro-batches
depends on the layout: micro-batch m of rank r is step[(m * world_size + r) * batch_size :
+ batch_size].

All randomness comes from a counter-based generator keyed by a stable hash of (seed, epoch, ...):
no global RNG, identical on every rank, and identical across Python and library versions.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence
from dataclasses import dataclass

_MASK64 = (1 << 64) - 1


def stable_seed(*parts: int | str) -> int:
    """A 64-bit seed mixed from ints and strings; the same in every process and Python run."""
    digest = hashlib.blake2b(digest_size=8)
    for part in parts:
        digest.update(f"{type(part).__name__}:{part}\x00".encode())
    return int.from_bytes(digest.digest(), "little")


def permutation(n: int, seed: int) -> list[int]:
    """A Fisher-Yates shuffle of range(n) driven by splitmix64 seeded with `seed`."""
    order = list(range(n))
    state = seed & _MASK64
    for i in range(n - 1, 0, -1):
        state = (state + 0x9E3779B97F4A7C15) & _MASK64
        z = ((state ^ (state >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
        j = (z ^ (z >> 31)) % (i + 1)  # modulo bias < n / 2**64: negligible
        order[i], order[j] = order[j], order[i]
    return order


@dataclass(frozen=True, slots=True)  # slots: one per image of a dataset
class SampleSpec:
    """One sample of a dataset's epoch: an item (index into the dataset's items) and its weight."""

    item: int
    loss_weight: float


@dataclass(frozen=True)
class SampleRef:
    """A scheduled sample: `index` into dataset `dataset`'s sample list; `position` in the epoch;
    `step` the epoch's optimizer step it belongs to; `padding` when it only fills a step."""

    dataset: int
    index: int
    position: int
    step: int = 0
    padding: bool = False


def balance_reg_repeats(repeats: Sequence[int], target: int) -> list[int]:
    """How often each regularisation image is used per epoch so that they total `target`.

    kohya's balancing: a first pass gives each image its own repeats in order until the target is
    reached; further passes add one use per image, round-robin. Images the first pass does not
    reach get 0, i.e. with more reg samples than train samples the later reg images are never
    used. Unlike kohya the last image of the first pass is cut so the total is exactly `target`.
    """
    counts = [0] * len(repeats)
    total = 0
    for i, r in enumerate(repeats):
        if total >= target:
            return counts
        counts[i] = min(r, target - total)
        total += counts[i]
    while repeats and total < target:
        for i in range(len(counts)):
            if total >= target:
                break
            counts[i] += 1
            total += 1
    return counts


def epoch_samples(items: Sequence[tuple[int, bool]], prior_loss_weight: float) -> list[SampleSpec]:
    """The samples of one dataset's epoch from its items given as (num_repeats, is_reg).

    Train items appear num_repeats times with weight 1. If there are reg items they are balanced
    (balance_reg_repeats) to as many samples as the train items give, with weight
    prior_loss_weight.
    """
    samples = []
    for i, (r, reg) in enumerate(items):
        if not reg:
            samples += [SampleSpec(i, 1.0)] * r  # one (frozen) object for an item's repeats
    reg_items = [(i, r) for i, (r, reg) in enumerate(items) if reg]
    counts = balance_reg_repeats([r for _, r in reg_items], len(samples))
    for (i, _), count in zip(reg_items, counts, strict=True):
        samples += [SampleSpec(i, prior_loss_weight)] * count
    return samples


class EpochSchedule:
    """The layout-invariant schedule of every epoch (see the module docstring).

    `datasets[d]` is dataset d's sample list for one epoch; `batch_sizes[d]` its micro-batch size
    per process. Epochs are numbered by the caller (any int); each is computed on demand.
    """

    def __init__(
        self,
        datasets: Sequence[Sequence[SampleSpec]],
        batch_sizes: Sequence[int],
        accumulation: int,
        world_size: int,
        seed: int,
    ) -> None:
        if len(datasets) != len(batch_sizes) or not datasets:
            raise ValueError("need one batch size per dataset and at least one dataset")
        if accumulation < 1 or world_size < 1 or any(b < 1 for b in batch_sizes):
            raise ValueError("batch sizes, accumulation and world_size must be at least 1")
        if any(len(samples) == 0 for samples in datasets):
            raise ValueError("every dataset needs at least one sample")
        self.samples: tuple[tuple[SampleSpec, ...], ...] = tuple(tuple(s) for s in datasets)
        self.batch_sizes = tuple(batch_sizes)
        self.accumulation = accumulation
        self.world_size = world_size
        self.seed = seed
        self.step_sizes = tuple(b * accumulation * world_size for b in batch_sizes)
        self._cache: tuple[int, tuple[tuple[SampleRef, ...], ...]] | None = None

    def dataset_steps(self, dataset: int) -> int:
        """Optimizer steps of `dataset` per epoch."""
        return math.ceil(len(self.samples[dataset]) / self.step_sizes[dataset])

    def dataset_padding(self, dataset: int) -> int:
        """Samples of `dataset` repeated per epoch to fill its last step."""
        steps = self.dataset_steps(dataset)
        return steps * self.step_sizes[dataset] - len(self.samples[dataset])

    @property
    def steps_per_epoch(self) -> int:
        """Optimizer steps per epoch (the same on every rank)."""
        return sum(self.dataset_steps(d) for d in range(len(self.samples)))

    @property
    def samples_per_epoch(self) -> int:
        """Samples per epoch before padding."""
        return sum(len(s) for s in self.samples)

    @property
    def padded_per_epoch(self) -> int:
        """Samples repeated per epoch to fill the datasets' last steps."""
        return sum(self.dataset_padding(d) for d in range(len(self.samples)))

    def sample(self, ref: SampleRef) -> SampleSpec:
        """The sample a reference points at."""
        return self.samples[ref.dataset][ref.index]

    def _steps(self, epoch: int) -> tuple[tuple[SampleRef, ...], ...]:
        if self._cache is not None and self._cache[0] == epoch:
            return self._cache[1]
        # (dataset, sample indices, index of the first padding slot in the chunk)
        chunks: list[tuple[int, list[int], int]] = []
        for d, samples in enumerate(self.samples):
            order = permutation(len(samples), stable_seed(self.seed, epoch, "samples", d))
            size = self.step_sizes[d]
            filled = [order[i % len(order)] for i in range(self.dataset_steps(d) * size)]
            chunks.extend(
                (d, filled[c : c + size], len(order) - c) for c in range(0, len(filled), size)
            )
        steps = []
        position = 0
        for k, c in enumerate(permutation(len(chunks), stable_seed(self.seed, epoch, "steps"))):
            d, indices, first_padding = chunks[c]
            steps.append(
                tuple(
                    SampleRef(d, i, position + j, k, j >= first_padding)
                    for j, i in enumerate(indices)
                )
            )
            position += len(indices)
        self._cache = (epoch, tuple(steps))
        return self._cache[1]

    def step(self, epoch: int, k: int) -> list[SampleRef]:
        """All B_eff samples of optimizer step `k` (0-based) of `epoch`, in micro-batch order."""
        if not 0 <= k < self.steps_per_epoch:
            raise IndexError(f"step {k} outside 0..{self.steps_per_epoch - 1}")
        return list(self._steps(epoch)[k])

    def micro_batches(self, epoch: int, rank: int, start_step: int = 0) -> list[list[SampleRef]]:
        """Rank `rank`'s micro-batches from optimizer step `start_step` to the end of `epoch`.

        In order: step start_step's micro-batches 0..accumulation-1, then the next step's, ...
        """
        if not 0 <= rank < self.world_size:
            raise ValueError(f"rank {rank} outside 0..{self.world_size - 1}")
        if not 0 <= start_step <= self.steps_per_epoch:
            raise ValueError(f"start_step {start_step} outside 0..{self.steps_per_epoch}")
        batches = []
        for refs in self._steps(epoch)[start_step:]:
            batch_size = self.batch_sizes[refs[0].dataset]
            for m in range(self.accumulation):
                start = (m * self.world_size + rank) * batch_size
                batches.append(list(refs[start : start + batch_size]))
        return batches
