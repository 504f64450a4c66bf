"""Learning-rate schedules whose lengths are counted in optimizer steps."""

from __future__ import annotations

import torch
from diffusers.optimization import get_scheduler

from library.config.schema import OptimizerSection
from library.errors import ConfigError
from library.training.optimizers import adafactor_relative_step, adafactor_schedule


def warmup_steps(section: OptimizerSection, total_steps: int) -> int:
    """lr_warmup_steps as a count; a float below 1 is a ratio of the total steps."""
    value = section.lr_warmup_steps
    steps = int(value * total_steps) if isinstance(value, float) and value < 1 else int(value)
    if steps > total_steps:
        raise ConfigError(
            f"lr_warmup_steps = {value} is longer than the run ({total_steps} optimizer steps); "
            "lower it or give a ratio below 1"
        )
    return steps


def build_scheduler(
    section: OptimizerSection, optimizer: torch.optim.Optimizer, total_steps: int
) -> torch.optim.lr_scheduler.LRScheduler:
    """The schedule stepped once per optimizer step, by the trainer, on every process alike.

    Relative-step Adafactor sets its own step size: its schedule only reports that step size
    (the config allows only lr_scheduler "adafactor" or "constant" and no warmup with it).
    """
    if adafactor_relative_step(section):
        return adafactor_schedule(optimizer, section.learning_rate)
    warmup = warmup_steps(section, total_steps)
    if section.lr_scheduler == "constant" and warmup:
        raise ConfigError(
            'lr_scheduler = "constant" ignores lr_warmup_steps; use "constant_with_warmup" or '
            "set lr_warmup_steps = 0"
        )
    return get_scheduler(
        section.lr_scheduler,
        optimizer=optimizer,
        num_warmup_steps=warmup,
        num_training_steps=total_steps,
        num_cycles=section.lr_scheduler_num_cycles,
        power=section.lr_scheduler_power,
    )


def restore_schedule(scheduler, saved: dict) -> None:
    """Put a freshly built schedule at the saved step.

    Only the position is taken from the saved state: the rates, shape and length are this
    run's config, so a resume with a new learning_rate, schedule or max_train_steps trains with
    them (the saved base rates would otherwise silently win). Other schedules (Adafactor's
    reporting stand-in) load their whole state.
    """
    if not isinstance(scheduler, torch.optim.lr_scheduler.LambdaLR):
        scheduler.load_state_dict(saved)
        return
    scheduler.last_epoch = saved["last_epoch"]
    scheduler._step_count = saved.get("_step_count", saved["last_epoch"] + 1)
    rates = [
        base * schedule(scheduler.last_epoch)
        for base, schedule in zip(scheduler.base_lrs, scheduler.lr_lambdas, strict=True)
    ]
    for group, base, rate in zip(scheduler.optimizer.param_groups, scheduler.base_lrs, rates, strict=True):
        group["initial_lr"], group["lr"] = base, rate
    scheduler._last_lr = rates
