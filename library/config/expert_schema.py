"""The [experts] section: which denoiser experts a run trains, for models that carry several
(one per range of noise levels: a high-noise and a low-noise transformer).

Every key is unset by default, and a model with one denoiser refuses a set one (it would change
nothing there). The words are musubi-tuner's where it has them (``timestep_boundary``,
``offload_inactive_dit``); ``train_experts`` is difftune's."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from library.config.section import Section

ExpertChoice = Literal["both", "high_noise", "low_noise"]


class ExpertSection(Section):
    train_experts: ExpertChoice | None = Field(
        None,
        description="On a model with a high-noise and a low-noise expert: train both (one "
        "adapter and one LoRA file per expert, <output_name>_high_noise and _low_noise), or "
        "only one of them, each on the noise levels of its own range (timestep_boundary). "
        'Unset: "both".',
    )
    timestep_boundary: float | None = Field(
        None,
        ge=0,
        le=1000,
        description="The noise level at which the high-noise expert hands over to the "
        "low-noise one, as musubi-tuner writes it: in [0, 1] (a value above 1 is read on the "
        "0-1000 timestep scale and divided by 1000). Levels at or above it are the high-noise "
        "expert's, in training and in samples. Unset: the model's own boundary_ratio.",
    )
    offload_inactive_dit: bool | None = Field(
        None,
        description="Training both experts: keep the expert a step does not use in host "
        "memory, moved to the GPU when a step needs it (less GPU memory, one transfer of a "
        "whole transformer whenever the expert changes). Unset: false.",
    )

    @property
    def boundary_fraction(self) -> float | None:
        """timestep_boundary as a fraction of the schedule (musubi-tuner's scales: [0, 1], or
        a timestep above 1 divided by 1000); None when unset."""
        given = self.timestep_boundary
        if given is None:
            return None
        return given / 1000.0 if given > 1 else given
