"""Optimizers by the names kohya users know, with their "key=value" arguments checked.

Every optimizer gets the parameter groups of setup.py, each with its own "lr" (unet_lr,
text_encoder_lr, LoRA+). Two names need more than construction:

- Adafactor with ``relative_step=True`` (its default, as in kohya) computes its own step size:
  the groups' learning rates are dropped and ``adafactor_schedule`` replaces the lr schedule.
- The schedule-free optimizers keep two weight sequences and must be switched to eval mode
  around sampling and saving (``optimizer_eval_mode`` / ``optimizer_train_mode``).
"""

from __future__ import annotations

import importlib
import inspect
from dataclasses import dataclass, field
from typing import Protocol

import torch

from library.config.kohya import parse_kv_args
from library.errors import ConfigError


class OptimizerKeys(Protocol):
    """The keys of the [optimizer] section this module reads (library.config.optimizer_schema's
    OptimizerSection checks its optimizer_args with this module, so this module does not
    import it)."""

    optimizer_type: str
    optimizer_args: list[str] | dict
    learning_rate: float


@dataclass(frozen=True)
class OptimizerSpec:
    """Where a named optimizer lives and what its name implies."""

    module: str
    attr: str
    package: str  # what to pip install when the import fails
    defaults: dict = field(default_factory=dict)  # kohya's; optimizer_args override them
    fixed: dict = field(default_factory=dict)  # implied by the name; not in optimizer_args


def _bnb(attr: str, **kw: dict) -> OptimizerSpec:
    return OptimizerSpec("bitsandbytes.optim", attr, "bitsandbytes", **kw)


_NESTEROV = {"defaults": {"momentum": 0.9}, "fixed": {"nesterov": True}}

SPECS: dict[str, OptimizerSpec] = {
    "AdamW": OptimizerSpec("torch.optim", "AdamW", "torch"),
    "AdamW8bit": _bnb("AdamW8bit"),
    "PagedAdamW": _bnb("PagedAdamW"),
    "PagedAdamW8bit": _bnb("PagedAdamW8bit"),
    "PagedAdamW32bit": _bnb("PagedAdamW32bit"),
    "Lion": OptimizerSpec("lion_pytorch", "Lion", "lion-pytorch"),
    "Lion8bit": _bnb("Lion8bit"),
    "PagedLion8bit": _bnb("PagedLion8bit"),
    "SGDNesterov": OptimizerSpec("torch.optim", "SGD", "torch", **_NESTEROV),
    "SGDNesterov8bit": _bnb("SGD8bit", **_NESTEROV),
    "Prodigy": OptimizerSpec("prodigyopt", "Prodigy", "prodigyopt"),
    "Adafactor": OptimizerSpec("transformers.optimization", "Adafactor", "transformers"),
    "AdamWScheduleFree": OptimizerSpec("schedulefree", "AdamWScheduleFree", "schedulefree"),
    "RAdamScheduleFree": OptimizerSpec("schedulefree", "RAdamScheduleFree", "schedulefree"),
    "SGDScheduleFree": OptimizerSpec("schedulefree", "SGDScheduleFree", "schedulefree"),
}


def optimizer_spec(name: str) -> OptimizerSpec:
    """The spec of a known name, or of a class path "module.Class"."""
    if name in SPECS:
        return SPECS[name]
    module, _, attr = name.rpartition(".")
    if not module:
        raise ConfigError(f'optimizer_type "{name}" is unknown; known: {", ".join(SPECS)}')
    return OptimizerSpec(module, attr, module.split(".")[0])


def optimizer_class(name: str) -> type[torch.optim.Optimizer]:
    """Import the class behind ``name``; ConfigError naming the package when that fails."""
    spec = optimizer_spec(name)
    try:
        cls = getattr(importlib.import_module(spec.module), spec.attr)
    except (ImportError, AttributeError) as exc:  # a broken CUDA setup also lands here
        raise ConfigError(
            f'optimizer_type = "{name}" needs {spec.package}, which failed to import ({exc}); '
            f"install it (pip install {spec.package}) or choose another optimizer_type"
        ) from exc
    return cls


def optimizer_class_path(name: str) -> str:
    """The module path and class name of the optimizer, as kohya writes it into ss_optimizer."""
    cls = optimizer_class(name)
    return f"{cls.__module__}.{cls.__name__}"


def optimizer_kwargs(section: OptimizerKeys) -> dict:
    """The optimizer_args as keyword arguments (kohya's "k=v" list or a TOML table)."""
    args = section.optimizer_args
    kwargs = dict(args) if isinstance(args, dict) else parse_kv_args(list(args))
    return {k: tuple(v) if isinstance(v, list) else v for k, v in kwargs.items()}


def adafactor_relative_step(section: OptimizerKeys) -> bool:
    """True when Adafactor sets its own step size (relative_step, True unless turned off)."""
    return (
        section.optimizer_type == "Adafactor"
        and optimizer_kwargs(section).get("relative_step", True) is True
    )


def check_optimizer_args(section: OptimizerKeys) -> None:
    """ConfigError when optimizer_args names an argument the optimizer does not take.

    Imports the optimizer's class; the config calls it when optimizer_args is not empty.
    """
    name = section.optimizer_type
    _check_args(name, optimizer_class(name), optimizer_spec(name), optimizer_kwargs(section))


def build_optimizer(section: OptimizerKeys, param_groups: list[dict]) -> torch.optim.Optimizer:
    """Construct the configured optimizer over ``param_groups`` (each group carries its own lr)."""
    name = section.optimizer_type
    spec, cls = optimizer_spec(name), optimizer_class(name)
    kwargs = optimizer_kwargs(section)
    _check_args(name, cls, spec, kwargs)
    kwargs = {**spec.defaults, **kwargs, **spec.fixed}
    _check_group_lrs(name, param_groups)
    lr: float | None = section.learning_rate
    if adafactor_relative_step(section):
        param_groups, lr = _without_lrs(param_groups, section.learning_rate), None
    try:
        optimizer = cls(param_groups, lr=lr, **kwargs)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"optimizer_args for {name} are not valid: {exc}") from exc
    optimizer_train_mode(optimizer)  # schedule-free optimizers start in eval mode
    return optimizer


def _check_args(name: str, cls: type, spec: OptimizerSpec, kwargs: dict) -> None:
    params = inspect.signature(cls.__init__).parameters
    fixed = sorted(set(kwargs) & set(spec.fixed))
    if fixed:
        raise ConfigError(
            f'optimizer_args: {name} always uses {fixed[0]}={spec.fixed[fixed[0]]}; remove "{fixed[0]}"'
        )
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return  # the class takes any keyword; it reports bad ones itself
    accepted = set(params) - {"self", "params", "lr"}
    unknown = sorted(set(kwargs) - accepted)
    if unknown:
        raise ConfigError(
            f'optimizer_args: {name} has no argument "{unknown[0]}"; '
            f"accepted: {', '.join(sorted(accepted))}"
        )


def _check_group_lrs(name: str, param_groups: list[dict]) -> None:
    # Prodigy adapts one step size for all groups; it refuses differing rates at its first step.
    rates = {group["lr"] for group in param_groups if group.get("lr")}
    if name == "Prodigy" and len(rates) > 1:
        raise ConfigError(
            "Prodigy needs one learning rate for every parameter group (0 freezes a group), got "
            f"{sorted(rates)}: make unet_lr and text_encoder_lr equal or remove them, and drop LoRA+"
        )


def _without_lrs(param_groups: list[dict], base_lr: float) -> list[dict]:
    """The groups without "lr": relative-step Adafactor refuses a learning rate."""
    if any(group.get("lr", base_lr) != base_lr for group in param_groups):
        raise ConfigError(
            "Adafactor with relative_step=True uses no learning rates, so unet_lr, "
            "text_encoder_lr and LoRA+ have no effect; remove them or add optimizer_args "
            '"relative_step=False"'
        )
    return [{k: v for k, v in group.items() if k != "lr"} for group in param_groups]


def adafactor_schedule(
    optimizer: torch.optim.Optimizer, initial_lr: float
) -> torch.optim.lr_scheduler.LRScheduler:
    """The stand-in schedule of relative-step Adafactor: it reports the step size Adafactor uses.

    Before the first step it reports ``initial_lr`` (kohya shows learning_rate there).
    """
    from transformers.optimization import AdafactorSchedule

    class _Reporting(AdafactorSchedule):
        # transformers' version reads groups whose grads are set; the trainer steps the schedule
        # after zero_grad, so read the optimizer state, which survives it.
        def get_lr(self) -> list[float]:
            opt = self.optimizer
            states = [opt.state.get(group["params"][0], {}) for group in opt.param_groups]
            if not all("step" in state for state in states):
                return list(self.base_lrs)
            return [opt._get_lr(g, s) for g, s in zip(opt.param_groups, states, strict=True)]

    return _Reporting(_unwrap(optimizer), initial_lr)


def _unwrap(optimizer: object) -> torch.optim.Optimizer:
    """The optimizer inside accelerate's wrapper (or itself)."""
    while not isinstance(optimizer, torch.optim.Optimizer) and hasattr(optimizer, "optimizer"):
        optimizer = optimizer.optimizer
    return optimizer


def _is_schedule_free(optimizer: torch.optim.Optimizer) -> bool:
    return any("train_mode" in group for group in optimizer.param_groups) and callable(
        getattr(optimizer, "eval", None)
    )


def optimizer_train_mode(optimizer: object) -> None:
    """Put a schedule-free optimizer's weights in train mode; a no-op for every other optimizer.

    Call it before the first optimizer step (also after loading a state) and after each
    ``optimizer_eval_mode``. Accepts accelerate's wrapped optimizer.
    """
    inner = _unwrap(optimizer)
    if _is_schedule_free(inner):
        inner.train()


def optimizer_eval_mode(optimizer: object) -> None:
    """Put a schedule-free optimizer's weights at their average (what sampling and saving must
    see); a no-op for every other optimizer."""
    inner = _unwrap(optimizer)
    if _is_schedule_free(inner):
        inner.eval()


def effective_learning_rates(optimizer: object) -> list[float]:
    """Per group, the step size the optimizer really uses: d * lr for Prodigy, the warmed-up lr
    of the schedule-free optimizers, else the group's lr (for logging)."""
    rates = []
    for group in _unwrap(optimizer).param_groups:
        lr = group.get("lr") or 0.0
        if "d" in group:
            lr = group["d"] * lr
        elif group.get("scheduled_lr"):
            lr = group["scheduled_lr"]
        rates.append(float(lr))
    return rates
