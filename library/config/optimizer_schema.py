"""The [optimizer] section: which optimizer, its arguments, learning rates and schedule."""

from __future__ import annotations

import importlib
from typing import Literal

import torch
from pydantic import Field, field_validator, model_validator

from library.config import kohya
from library.config.scheduler_args import scheduler_args, scheduler_args_problem
from library.config.section import Section
from library.config.suggest import nearest
from library.errors import ConfigError
from library.training.optimizers import check_optimizer_args

# Learning rates multiply float32 weights: above float32's largest value they cannot be applied.
MAX_RATE = 3.0e38

SchedulerName = Literal[
    "constant",
    "constant_with_warmup",
    "linear",
    "cosine",
    "cosine_with_restarts",
    "polynomial",
    "adafactor",
    "cosine_with_min_lr",
    "warmup_stable_decay",
    "inverse_sqrt",
    "piecewise_constant",
]


# Optimizers whose step is element-wise (or uses only per-group scalars), so each process can
# step its slices alone and get what an unsharded step gives (tests/distributed/
# fsdp_optimizers.py checks each). Prodigy and Adafactor reduce over whole tensors and
# bitsandbytes' kernels take plain tensors only.
SHARDABLE_OPTIMIZERS = (
    "AdamW",
    "Lion",
    "SGDNesterov",
    "AdamWScheduleFree",
    "RAdamScheduleFree",
    "SGDScheduleFree",
)


class OptimizerSection(Section):
    optimizer_type: str = Field(
        "AdamW",
        description="Optimizer by kohya's name, case-insensitive: AdamW, AdamW8bit, PagedAdamW, "
        "PagedAdamW8bit, PagedAdamW32bit, Lion, Lion8bit, PagedLion8bit, SGDNesterov, "
        "SGDNesterov8bit, Prodigy, Adafactor, AdamWScheduleFree, RAdamScheduleFree, "
        'SGDScheduleFree; or any optimizer class by its import path, e.g. "torch.optim.RMSprop". '
        "Adafactor sets its own step size unless optimizer_args has relative_step=False; then "
        'lr_scheduler must be "adafactor" (or "constant") without warmup. The schedule-free ones '
        'need lr_scheduler = "constant" (warmup: optimizer_args "warmup_steps=N"). Prodigy takes '
        "one learning rate for all weights (usually 1.0).",
    )
    optimizer_args: list[str] | dict[str, bool | int | float | str | list[float]] = Field(
        default_factory=list,
        description='Extra optimizer arguments: a list of "key=value" strings (kohya) or a table, '
        'e.g. ["weight_decay=0.01", "betas=0.9,0.99"].',
    )
    learning_rate: float = Field(
        1e-4, ge=0, le=MAX_RATE, description="Base learning rate."
    )
    max_grad_norm: float = Field(
        1.0,
        ge=0,
        description="Clip the gradient norm to this value each optimizer step; 0 disables.",
    )
    lr_scheduler: SchedulerName = Field(
        "constant",
        description='Learning-rate schedule (docs/training-options.md#learning-rate-schedules); '
        '"adafactor" reports the step size of Adafactor.',
    )
    lr_warmup_steps: int | float = Field(
        0,
        ge=0,
        description="Warmup length in optimizer steps; a float below 1 is a ratio of the total steps.",
    )
    lr_decay_steps: int | float = Field(
        0,
        ge=0,
        description='warmup_stable_decay: length of the final decay in optimizer steps (a float '
        "below 1 is a ratio of the total steps); the steps between warmup and decay keep the "
        "full rate. 0: no decay.",
    )
    lr_scheduler_num_cycles: int = Field(
        1,
        ge=1,
        description="Cycles of cosine_with_restarts; cosine_with_min_lr and warmup_stable_decay "
        "make N/2 cosine waves of it (1: one half wave, down to the floor), as sd-scripts.",
    )
    lr_scheduler_power: float = Field(1.0, gt=0, description="Power of the polynomial schedule.")
    lr_scheduler_min_lr_ratio: float | None = Field(
        None,
        ge=0,
        le=1,
        description="The floor of cosine_with_min_lr and warmup_stable_decay, as a ratio of each "
        "learning rate (warmup_stable_decay also warms up from it). Unset: 0 for "
        "warmup_stable_decay; cosine_with_min_lr needs it (or min_lr in lr_scheduler_args).",
    )
    lr_scheduler_timescale: int | None = Field(
        None,
        ge=1,
        description="inverse_sqrt: after warmup the rate is sqrt(timescale / (step + timescale - "
        "warmup)) times the learning rate. Unset or 0: the warmup length (10000 without warmup).",
    )
    lr_scheduler_args: list[str] | dict[str, bool | int | float | str] = Field(
        default_factory=list,
        description='Extra schedule arguments: kohya\'s "key=value" strings (values read as '
        'Python literals) or a table. piecewise_constant needs step_rules ("1:100,0.5:200,0.1": '
        "x1 before step 100, x0.5 before step 200, then x0.1); also min_lr (cosine_with_min_lr, "
        'a rate), warmup_type and decay_type ("linear", "cosine", "1-sqrt"; '
        "warmup_stable_decay), lr_end (polynomial), num_cycles (cosine).",
    )
    loraplus_lr_ratio: float | None = Field(
        None,
        gt=0,
        description="LoRA+: the up (B) matrices learn this many times faster than the down (A) "
        "matrices (16 is common). Unset: same rate. Also accepted in network_args.",
    )
    loraplus_unet_lr_ratio: float | None = Field(
        None, gt=0, description="LoRA+ ratio of the UNet adapter. Unset: loraplus_lr_ratio."
    )
    loraplus_text_encoder_lr_ratio: float | None = Field(
        None,
        gt=0,
        description="LoRA+ ratio of the text-encoder adapter. Unset: loraplus_lr_ratio.",
    )

    @field_validator("optimizer_type")
    @classmethod
    def _known_optimizer(cls, name: str) -> str:
        if name.lower() in kohya.OPTIMIZERS:
            return kohya.OPTIMIZERS[name.lower()]
        if "." not in name and isinstance(getattr(torch.optim, name, None), type):
            return f"torch.optim.{name}"  # any torch optimizer by its class name, e.g. "RMSprop"
        if "." not in name:
            near = nearest(name.lower(), kohya.OPTIMIZERS)
            hint = f'did you mean "{kohya.OPTIMIZERS[near]}"? ' if near else ""
            known = ", ".join(kohya.OPTIMIZERS.values())
            raise ValueError(f'unknown optimizer "{name}"; {hint}known: {known}, or a class path')
        module, _, attr = name.rpartition(".")
        try:
            found = getattr(importlib.import_module(module), attr, None)
        except ImportError as exc:
            raise ValueError(f"cannot import {module} for optimizer {name} ({exc})") from None
        if not isinstance(found, type):
            raise ValueError(f"{module} has no optimizer class {attr}")
        return name

    @model_validator(mode="after")
    def _schedule_rules(self) -> OptimizerSection:
        name, scheduler = self.optimizer_type, self.lr_scheduler
        relative = name == "Adafactor" and self._arg("relative_step", True) is True
        if name == "Adafactor" and self._arg("warmup_init", False) is True and not relative:
            raise ValueError("Adafactor: warmup_init=True needs relative_step=True; drop one")
        if scheduler == "adafactor" and not relative:
            raise ValueError(
                'lr_scheduler = "adafactor" only goes with optimizer_type = "Adafactor" and its '
                "relative step (the default); use another lr_scheduler"
            )
        if relative and (scheduler not in ("adafactor", "constant") or self.lr_warmup_steps):
            raise ValueError(
                "Adafactor with relative_step=True sets its own step size: use lr_scheduler = "
                '"adafactor" and lr_warmup_steps = 0 (warmup: optimizer_args "warmup_init=True"), '
                'or add optimizer_args "relative_step=False" to use learning_rate and a schedule'
            )
        if relative and any(self._ratios()):
            raise ValueError(
                "LoRA+ needs learning rates; Adafactor with relative_step=True has none"
            )
        if name == "Prodigy" and any(self._ratios()):
            raise ValueError("Prodigy takes one learning rate for all weights, so no LoRA+")
        if name.lower().endswith("schedulefree") and (
            scheduler != "constant" or self.lr_warmup_steps
        ):
            raise ValueError(
                f'{name} needs no schedule: set lr_scheduler = "constant" and lr_warmup_steps = 0 '
                '(warmup: optimizer_args "warmup_steps=N")'
            )
        return self

    @model_validator(mode="after")
    def _schedule_args(self) -> OptimizerSection:
        try:
            args = scheduler_args(self.lr_scheduler_args)
        except ConfigError as exc:
            raise ValueError(str(exc)) from None
        problem = scheduler_args_problem(self.lr_scheduler, args)
        if problem:
            raise ValueError(problem)
        ratio, scheduler = self.lr_scheduler_min_lr_ratio, self.lr_scheduler
        if scheduler == "cosine_with_min_lr" and ratio is None and "min_lr" not in args:
            raise ValueError(
                'lr_scheduler = "cosine_with_min_lr" needs its floor: set '
                'lr_scheduler_min_lr_ratio (e.g. 0.1) or lr_scheduler_args "min_lr=..."'
            )
        if "min_lr" in args and not self.learning_rate:
            raise ValueError(
                'lr_scheduler_args "min_lr" is a share of learning_rate, which is 0; use '
                "lr_scheduler_min_lr_ratio"
            )
        if ratio is not None and "min_lr" in args:
            raise ValueError(
                'lr_scheduler_min_lr_ratio and lr_scheduler_args "min_lr" both set the floor; '
                "keep one"
            )
        if scheduler == "piecewise_constant" and "step_rules" not in args:
            raise ValueError(
                'lr_scheduler = "piecewise_constant" needs lr_scheduler_args '
                '"step_rules=1:100,0.5:200,0.1" (multiplier:until step, ..., last multiplier)'
            )
        if scheduler == "piecewise_constant" and self.lr_warmup_steps:
            raise ValueError(
                'lr_scheduler = "piecewise_constant" has no warmup (sd-scripts ignores it); set '
                "lr_warmup_steps = 0 or start step_rules with a lower multiplier"
            )
        return self

    @model_validator(mode="after")
    def _args_accepted(self) -> OptimizerSection:
        if self.optimizer_args:  # only then is the optimizer's class worth importing
            try:
                check_optimizer_args(self)
            except ConfigError as exc:
                raise ValueError(str(exc)) from None
        return self

    def _arg(self, key: str, default: object) -> object:
        args = self.optimizer_args
        try:
            values = args if isinstance(args, dict) else kohya.parse_kv_args(list(args))
        except ConfigError as exc:  # reported with its file by the loader; here for direct use
            raise ValueError(str(exc)) from None
        return values.get(key, default)

    def _ratios(self) -> tuple[float | None, ...]:
        return (
            self.loraplus_lr_ratio,
            self.loraplus_unet_lr_ratio,
            self.loraplus_text_encoder_lr_ratio,
        )
