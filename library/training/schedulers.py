"""Learning-rate schedules whose lengths are counted in optimizer steps."""

from __future__ import annotations

import torch
from diffusers.optimization import (
    get_cosine_schedule_with_warmup,
    get_piecewise_constant_schedule,
    get_polynomial_decay_schedule_with_warmup,
    get_scheduler,
)
from transformers.optimization import (
    get_cosine_with_min_lr_schedule_with_warmup,
    get_inverse_sqrt_schedule,
    get_wsd_schedule,
)

from library.config.scheduler_args import scheduler_args
from library.config.schema import OptimizerSection
from library.errors import ConfigError
from library.training.optimizers import adafactor_relative_step, adafactor_schedule

LambdaLR = torch.optim.lr_scheduler.LambdaLR


def _steps(key: str, value: int | float, total_steps: int) -> int:
    """A length in optimizer steps; a float below 1 is a ratio of the total steps."""
    steps = int(value * total_steps) if isinstance(value, float) and value < 1 else int(value)
    if steps > total_steps:
        raise ConfigError(
            f"{key} = {value} is longer than the run ({total_steps} optimizer steps); lower it "
            "or give a ratio below 1"
        )
    return steps


def warmup_steps(section: OptimizerSection, total_steps: int) -> int:
    """lr_warmup_steps as a count; a float below 1 is a ratio of the total steps."""
    return _steps("lr_warmup_steps", section.lr_warmup_steps, total_steps)


def decay_steps(section: OptimizerSection, total_steps: int) -> int:
    """lr_decay_steps as a count (warmup_stable_decay); it must fit after the warmup."""
    decay = _steps("lr_decay_steps", section.lr_decay_steps, total_steps)
    warmup = warmup_steps(section, total_steps)
    if warmup + decay > total_steps:
        raise ConfigError(
            f"lr_warmup_steps ({warmup} steps) and lr_decay_steps ({decay} steps) together are "
            f"longer than the run ({total_steps} optimizer steps); shorten one of them"
        )
    return decay


def _schedule(section: OptimizerSection, optimizer, warmup: int, total: int) -> LambdaLR | None:
    """The schedules that take more than diffusers' get_scheduler passes, built as sd-scripts
    builds them (cosine_with_min_lr and warmup_stable_decay make num_cycles / 2 waves); None for
    the others."""
    name, args = section.lr_scheduler, scheduler_args(section.lr_scheduler_args)
    half_waves = section.lr_scheduler_num_cycles / 2
    ratio = section.lr_scheduler_min_lr_ratio
    if name == "cosine":
        return get_cosine_schedule_with_warmup(optimizer, warmup, total, **args)
    if name == "polynomial":
        power = section.lr_scheduler_power
        return get_polynomial_decay_schedule_with_warmup(optimizer, warmup, total, power=power, **args)
    if name == "cosine_with_min_lr":
        return get_cosine_with_min_lr_schedule_with_warmup(
            optimizer, warmup, total, num_cycles=half_waves, min_lr_rate=ratio, **args
        )
    if name == "warmup_stable_decay":
        decay = decay_steps(section, total)
        return get_wsd_schedule(
            optimizer,
            num_warmup_steps=warmup,
            num_decay_steps=decay,
            num_stable_steps=total - warmup - decay,
            min_lr_ratio=ratio or 0.0,
            num_cycles=half_waves,
            **args,
        )
    if name == "inverse_sqrt":
        return get_inverse_sqrt_schedule(optimizer, warmup, section.lr_scheduler_timescale)
    if name == "piecewise_constant":
        return get_piecewise_constant_schedule(optimizer, args["step_rules"])
    return None


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
    built = _schedule(section, optimizer, warmup, total_steps)
    if built is not None:
        return built
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
