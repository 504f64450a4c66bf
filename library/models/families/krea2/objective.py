"""Krea 2's objective (diffusers' Krea2Pipeline with FlowMatchEulerDiscreteScheduler): x_t =
(1 - sigma) x0 + sigma noise, the transformer's timestep is sigma and its output the velocity
noise - x0 (``scheduler.step`` takes it as it is). Training sigmas default to musubi-tuner's
Krea 2 guide: ``shift`` with discrete_flow_shift 2.5 (the pipeline's shift at 1024 x 1024),
weighting_scheme none; any [flow] draw key replaces them."""

from __future__ import annotations

import dataclasses

from library.models.families.krea2.entry import SIGMA_KEYS
from library.training import flow_matching as fm
from library.training.objectives import FlowMatchingObjective, FlowOptions

DEFAULTS = {"timestep_sampling": "shift", "sigmoid_scale": 1.0, "discrete_flow_shift": 2.5,
            "weighting_scheme": "none", "model_prediction_type": "raw"}  # fmt: skip


def krea2_flow_options(flow: object) -> FlowOptions:
    """The set [flow] draw keys over the defaults; the raw output is the prediction."""
    given = {key: getattr(flow, key) for key in SIGMA_KEYS if getattr(flow, key, None) is not None}
    return dataclasses.replace(FlowOptions(), **{**DEFAULTS, **given})


class Krea2FlowObjective(FlowMatchingObjective):
    """Rectified flow: sigma in, velocity noise - x0 out."""

    LABEL = "Krea 2"

    def describe(self) -> str:
        return (
            f"rectified flow, velocity target at timestep sigma, timestep_sampling "
            f"{self.sampling_text()}, weighting_scheme {self.options.weighting_scheme}"
        )

    def prediction(self, output, noisy, t):
        return output

    def level_weights(self, options, t):
        return fm.output_loss_weights(self.options.weighting_scheme, t)
