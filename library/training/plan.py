"""The run's plan in optimizer steps: totals, epochs, warmup and what is saved when."""

from __future__ import annotations

import math
from dataclasses import dataclass

from library.config.schema import Config
from library.saving.outputs import REPLACED, OutputLayout
from library.training.schedulers import decay_steps, warmup_steps

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
    if config.optimizer.lr_scheduler == "warmup_stable_decay":
        decay_steps(config.optimizer, total)  # a decay that does not fit stops before training
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


@dataclass(frozen=True)
class SaveCadence:
    """Saves made every ``every`` steps or epochs before the end."""

    every: int
    unit: str  # "steps" or "epochs"
    count: int  # saves of this cadence in the run (the end's save is not one of them)
    keep_last: int | None  # saves within the last N steps / the last N epoch saves are kept
    state: bool  # each save also writes a training state
    keep_last_state: int | None = None  # the same for the states (save_last_n_*_state)


@dataclass(frozen=True)
class SaveSchedule:
    """What the run writes when: the plan's text and its JSON both come from this."""

    cadences: tuple[SaveCadence, ...]
    what: str  # "LoRA" or "UNet"
    final: str  # the final file: <output_dir>/<output_name>.safetensors
    final_state: bool  # a training state is saved at the end too


def save_schedule(config: Config, plan: RunPlan) -> SaveSchedule:
    """The saves of a run planned as ``plan``."""
    saving = config.saving
    cadences = []
    if saving.save_every_n_steps:
        every = saving.save_every_n_steps
        count = (plan.total_steps - 1) // every  # the last step is the final save
        states = saving.save_last_n_steps_state or saving.save_last_n_steps
        cadences.append(
            SaveCadence(
                every, "steps", count, saving.save_last_n_steps, saving.save_state, states
            )
        )
    if saving.save_every_n_epochs:
        every = saving.save_every_n_epochs
        count = (plan.epochs - 1) // every
        states = saving.save_last_n_epochs_state or saving.save_last_n_epochs
        cadences.append(
            SaveCadence(
                every, "epochs", count, saving.save_last_n_epochs, saving.save_state, states
            )
        )
    return SaveSchedule(
        cadences=tuple(cadences),
        what="LoRA" if config.network.train_mode == "lora" else "UNet",
        final=f"{saving.output_dir}/{saving.output_name}.safetensors",
        final_state=bool(saving.save_state or saving.save_state_on_train_end),
    )


def save_schedule_lines(config: Config, plan: RunPlan) -> list[str]:
    """Human-readable lines saying what is written when."""
    schedule = save_schedule(config, plan)
    lines = []
    for cadence in schedule.cadences:
        state = " + training state" if cadence.state else ""
        keep = ""
        if cadence.keep_last and cadence.unit == "steps":
            keep = f", keeping those of the last {cadence.keep_last} steps"
        elif cadence.keep_last:
            keep = f", keeping the last {cadence.keep_last}"
        if cadence.state and cadence.keep_last_state != cadence.keep_last:
            keep += _state_keep(cadence)
        lines.append(f"every {cadence.every} {cadence.unit} ({cadence.count} saves){state}{keep}")
    end_state = " + training state" if schedule.final_state else ""
    lines.append(f"at the end: {schedule.what} {schedule.final}{end_state}")
    return _set_aside_lines(config) + lines


def _set_aside_lines(config: Config) -> list[str]:
    """What --overwrite moves aside before the first step (OutputLayout.set_aside)."""
    if not config.saving.overwrite or config.saving.resume:
        return []
    layout = OutputLayout(config.saving)
    outputs, samples = layout.earlier_run()
    if not outputs and not samples:
        return []
    outputs = [path for path in outputs if path != layout.summary]  # a record, not an output
    files = [_count(len(outputs), "output"), _count(len(samples), "sample image")]
    what = " and ".join(text for text in files if text) or "summary"
    return [
        f"first (--overwrite): the earlier run's {what} of this name "
        f"{'moves' if what == 'summary' else 'move'} to "
        f"{layout.dir / (layout.name + REPLACED)}<date>_<time>, so none is left among this run's"
    ]


def _count(count: int, what: str) -> str:
    return f"{count} {what}{'s' if count != 1 else ''}" if count else ""


def _state_keep(cadence: SaveCadence) -> str:
    """The plan's words for states kept by their own save_last_n_*_state."""
    if cadence.keep_last_state is None:
        return "; every state is kept"
    if cadence.unit == "steps":
        return f"; states: those of the last {cadence.keep_last_state} steps"
    return f"; states: the last {cadence.keep_last_state}"
