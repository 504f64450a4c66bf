"""Denoiser experts: a model whose denoising is split between several networks, each owning a
range of noise levels (a high-noise and a low-noise transformer of the same shape, switched at
the model's ``boundary_ratio``, as diffusers' two-transformer video pipelines hold them).

A family declares them by returning ``Components.experts``: the networks by name and the
boundary its model's config gives. The training code (library.training.experts) does the rest:
which experts train, their ranges, the routing of each optimizer step, one adapter and one file
per expert."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from library.errors import ConfigError

if TYPE_CHECKING:
    from library.config.config_view import ConfigView

HIGH_NOISE = "high_noise"
LOW_NOISE = "low_noise"
EXPERT_NAMES = (HIGH_NOISE, LOW_NOISE)  # from the highest noise levels down


@dataclass
class Experts:
    """The denoiser experts of a loaded model: ``modules`` by name (EXPERT_NAMES, each frozen
    like every loaded module) and ``boundary_ratio``, the noise level (as a fraction of the
    schedule, 0 clean to 1 pure noise) from which the high-noise expert denoises, as the
    model's config gives it (None when it gives none). ``Components.denoiser`` is the
    low-noise expert: what a one-denoiser run, validation and sampling use by default."""

    modules: dict[str, torch.nn.Module]
    boundary_ratio: float | None

    def __post_init__(self) -> None:
        if tuple(self.modules) != EXPERT_NAMES:
            raise ValueError(
                f"experts must be {EXPERT_NAMES} in that order, got {tuple(self.modules)}"
            )


def boundary(config: ConfigView, experts: Experts) -> float:
    """The boundary between the experts as a fraction: ``timestep_boundary`` (musubi-tuner's
    word and scales: [0, 1], or a timestep above 1 divided by 1000), else the model's
    ``boundary_ratio``; ConfigError when neither gives one."""
    given = config.experts.boundary_fraction
    if given is not None:
        return given
    if experts.boundary_ratio is None:
        raise ConfigError(
            "this model's config gives no boundary_ratio between its high-noise and low-noise "
            "experts; set timestep_boundary (e.g. 0.875, at or above which the high-noise "
            "expert denoises)"
        )
    return experts.boundary_ratio
