"""The [optimizer] section: which optimizer, its arguments, learning rates and schedule."""

from __future__ import annotations

import importlib
from typing import Literal

import torch
from pydantic import Field, field_validator, model_validator

from library.config import kohya
from library.config.section import Section
from library.config.suggest import nearest
from library.errors import ConfigError

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
        description='Learning-rate schedule; "adafactor" reports the step size of Adafactor.',
    )
    lr_warmup_steps: int | float = Field(
        0,
        ge=0,
        description="Warmup length in optimizer steps; a float below 1 is a ratio of the total steps.",
    )
    lr_scheduler_num_cycles: int = Field(1, ge=1, description="Cycles of cosine_with_restarts.")
    lr_scheduler_power: float = Field(1.0, gt=0, description="Power of the polynomial schedule.")
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
    def _args_accepted(self) -> OptimizerSection:
        if self.optimizer_args:  # only then is the optimizer's class worth importing
            from library.training.optimizers import check_optimizer_args

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
