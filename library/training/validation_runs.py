"""When the validation loss is computed during training, and on which images."""

from __future__ import annotations

import functools
import itertools
from collections.abc import Iterable, Iterator

import torch

from library.config.schema import Config
from library.data.dataset import TrainData
from library.data.samples import SampleSource
from library.training.optimizers import optimizer_eval_mode, optimizer_train_mode
from library.training.sharding import shards
from library.training.step import StepInputs
from library.training.unreadable import UnreadableImages
from library.training.validation import NoValidationSamples, validation_loss


class Validator:
    """Runs the validation loss on its cadence: every validate_every_n_steps optimizer steps,
    every validate_every_n_epochs epochs, or (neither set) after every epoch. Disabled when no
    dataset holds images out. Every process takes part (each scores its share of the batches)."""

    def __init__(self, config: Config, data: TrainData, accelerator) -> None:
        self.data = data
        self.accelerator = accelerator
        self.every_steps = config.data.validate_every_n_steps
        self.every_epochs = config.data.validate_every_n_epochs
        self.max_batches = config.data.max_validation_steps
        held = [d for d in config.datasets if d.held_out]
        first_seed = held[0].validation_seed if held else None
        self.seed = first_seed if first_seed is not None else config.training.seed
        self.enabled = data.num_validation_images > 0
        self.inputs: StepInputs | None = None
        self.source = SampleSource()
        self.optimizer = None
        # a sharded denoiser computes only with every process taking part: each scores all
        self.lockstep = shards(config, accelerator)

    def attach(self, inputs: StepInputs, source: SampleSource, optimizer=None) -> None:
        """What the loss needs: the live models (StepInputs), where latents come from, and the
        optimizer (a schedule-free one is scored on its averaged weights, as samples are)."""
        self.inputs, self.source, self.optimizer = inputs, source, optimizer

    def due_after_step(self, global_step: int) -> bool:
        return self.enabled and bool(self.every_steps) and global_step % self.every_steps == 0

    def due_after_epoch(self, epoch: int) -> bool:
        """`epoch` counts from 1 (the epoch just finished)."""
        if not self.enabled:
            return False
        if self.every_epochs:
            return epoch % self.every_epochs == 0
        return not self.every_steps

    def run(self, unreadable: UnreadableImages) -> float | None:
        """The mean validation loss over every validation image of every process; images that
        cannot be read now are left out and noted in ``unreadable`` (None: every one was)."""
        acc, inputs = self.accelerator, self.inputs
        if self.lockstep:  # every process scores every batch: nothing to sum over processes
            shares = range(acc.num_processes)
            batches = itertools.chain.from_iterable(
                self.data.validation_loader(rank, self.source, self.max_batches) for rank in shares
            )
            reduce = None
        else:
            batches = self.data.validation_loader(acc.process_index, self.source, self.max_batches)
            reduce = functools.partial(acc.reduce, reduction="sum")
        timesteps = inputs.objective.validation_levels()
        if self.optimizer is not None:
            optimizer_eval_mode(self.optimizer)
        try:
            with acc.autocast():
                noted = _noting(batches, unreadable)
                return validation_loss(inputs, noted, timesteps, self.seed, reduce=reduce)
        except NoValidationSamples:  # every image unreadable now, on every process
            return None
        finally:
            if self.optimizer is not None:
                optimizer_train_mode(self.optimizer)

    def met_unreadable(self, unreadable: UnreadableImages) -> bool:
        """Whether any process met an unreadable image in the last run; call it on every process
        after ``run`` (a collective unless every process scored every batch)."""
        acc = self.accelerator
        if self.lockstep or acc.num_processes == 1:
            return bool(unreadable.pending)
        count = torch.tensor([float(len(unreadable.pending))], device=acc.device)
        return bool(acc.reduce(count, reduction="sum").item())


def _noting(batches: Iterable[dict], unreadable: UnreadableImages) -> Iterator[dict]:
    for batch in batches:
        unreadable.note(batch)
        yield batch
