"""The run's plan in optimizer steps: totals, epochs, warmup and what is saved when."""

from __future__ import annotations

import math
from dataclasses import dataclass

from library.config.schema import Config
from library.training.schedulers import warmup_steps

DEFAULT_MAX_TRAIN_STEPS = 1600  # kohya's default when neither steps nor epochs are given


@dataclass(frozen=True)
class RunPlan:
    """Step counts shared by the trainer, the saver and the printed plan."""

    steps_per_epoch: int
    total_steps: int
    epochs: int
    warmup_steps: int
    world_size: int
    accumulation: int
    effective_batch_sizes: tuple[int, ...]  # per dataset: batch x accumulation x processes

    def epoch_of_step(self, step: int) -> int:
        """0-based epoch that optimizer step ``step`` (0-based) belongs to."""
        return step // self.steps_per_epoch


def make_plan(config: Config, steps_per_epoch: int, world_size: int) -> RunPlan:
    """Resolve max_train_epochs / max_train_steps into one total, counted in optimizer steps."""
    training = config.training
    if training.max_train_epochs is not None:
        total = training.max_train_epochs * steps_per_epoch
    else:
        total = training.max_train_steps or DEFAULT_MAX_TRAIN_STEPS
    accumulation = training.gradient_accumulation_steps
    return RunPlan(
        steps_per_epoch=steps_per_epoch,
        total_steps=total,
        epochs=math.ceil(total / steps_per_epoch),
        warmup_steps=warmup_steps(config.optimizer, total),
        world_size=world_size,
        accumulation=accumulation,
        effective_batch_sizes=tuple(
            d.batch_size * accumulation * world_size for d in config.datasets
        ),
    )


def save_schedule_lines(config: Config, plan: RunPlan) -> list[str]:
    """Human-readable lines saying what is written when."""
    saving = config.saving
    what = "LoRA" if config.network.train_mode == "lora" else "UNet"
    state = " + training state" if saving.save_state else ""
    lines = []
    if saving.save_every_n_steps:
        count = (plan.total_steps - 1) // saving.save_every_n_steps  # the last step is the final save
        keep = f", keeping those of the last {saving.save_last_n_steps} steps" if saving.save_last_n_steps else ""
        lines.append(f"every {saving.save_every_n_steps} steps ({count} saves){state}{keep}")
    if saving.save_every_n_epochs:
        count = (plan.epochs - 1) // saving.save_every_n_epochs
        keep = f", keeping the last {saving.save_last_n_epochs}" if saving.save_last_n_epochs else ""
        lines.append(f"every {saving.save_every_n_epochs} epochs ({count} saves){state}{keep}")
    end_state = " + training state" if saving.save_state or saving.save_state_on_train_end else ""
    lines.append(f"at the end: {what} {saving.output_dir}/{saving.output_name}.safetensors{end_state}")
    return lines
