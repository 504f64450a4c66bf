"""Krea 2's objective (diffusers' Krea2Pipeline with FlowMatchEulerDiscreteScheduler): x_t =
(1 - sigma) x0 + sigma noise, the transformer's timestep is sigma and its output the velocity
noise - x0 (``scheduler.step`` takes it as it is). Training sigmas default to musubi-tuner's
Krea 2 guide: ``shift`` with discrete_flow_shift 2.5 (the pipeline's shift at 1024 x 1024),
weighting_scheme none; any [flow] draw key replaces them."""

from __future__ import annotations

from library.training.objectives import FlowOptions, VelocityObjective, flow_options_over

DEFAULTS = {"timestep_sampling": "shift", "sigmoid_scale": 1.0, "discrete_flow_shift": 2.5,
            "weighting_scheme": "none", "model_prediction_type": "raw"}  # fmt: skip


def krea2_flow_options(flow: object) -> FlowOptions:
    """The set [flow] draw keys over the defaults; the raw output is the prediction."""
    return flow_options_over(flow, DEFAULTS)


class Krea2FlowObjective(VelocityObjective):
    """Rectified flow: sigma in, velocity noise - x0 out."""

    LABEL = "Krea 2"
