"""Optimizers by the names kohya users know, with their "key=value" arguments checked."""

from __future__ import annotations

import inspect

import torch

from library.config.schema import OptimizerSection
from library.errors import ConfigError


def _optimizer_class(name: str) -> type[torch.optim.Optimizer]:
    if name == "AdamW":
        return torch.optim.AdamW
    if name == "AdamW8bit":
        try:
            import bitsandbytes as bnb
        except ImportError as exc:  # a broken CUDA setup also lands here
            raise ConfigError(
                f'optimizer_type = "AdamW8bit" needs bitsandbytes, which failed to import ({exc}); '
                'install it (pip install bitsandbytes) or use optimizer_type = "AdamW"'
            ) from exc
        return bnb.optim.AdamW8bit
    raise ConfigError(f'optimizer_type "{name}" is not supported; use "AdamW" or "AdamW8bit"')


def optimizer_kwargs(section: OptimizerSection) -> dict:
    """The optimizer_args as keyword arguments (kohya's "k=v" list or a TOML table)."""
    from library.config.kohya import parse_kv_args

    args = section.optimizer_args
    kwargs = dict(args) if isinstance(args, dict) else parse_kv_args(list(args))
    return {k: tuple(v) if isinstance(v, list) else v for k, v in kwargs.items()}


def build_optimizer(section: OptimizerSection, param_groups: list[dict]) -> torch.optim.Optimizer:
    """Construct the configured optimizer over ``param_groups`` (each group carries its own lr)."""
    cls = _optimizer_class(section.optimizer_type)
    kwargs = optimizer_kwargs(section)
    accepted = set(inspect.signature(cls.__init__).parameters) - {"self", "params", "lr"}
    unknown = sorted(set(kwargs) - accepted)
    if unknown:
        raise ConfigError(
            f'optimizer_args: {section.optimizer_type} has no argument "{unknown[0]}"; '
            f"accepted: {', '.join(sorted(accepted))}"
        )
    try:
        return cls(param_groups, lr=section.learning_rate, **kwargs)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"optimizer_args for {section.optimizer_type} are not valid: {exc}") from exc
