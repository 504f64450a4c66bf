"""Krea 2's training objective: the shared rectified flow with musubi-tuner's Krea 2 draw.

The facts (diffusers 0.42.1 Krea2Pipeline with FlowMatchEulerDiscreteScheduler):

- x_t = (1 - sigma) x0 + sigma noise (sigma 1 = pure noise); the transformer's timestep input
  is the scheduler's timestep / 1000 = sigma;
- its output goes to ``scheduler.step`` as it is (x + (sigma_next - sigma) v): the output is the
  **velocity noise - x0**, the shared objective's target;
- sampling shifts sigma by the image's token count (mu from 0.5 at 256 tokens to 1.15 at 6400,
  or Turbo's fixed 1.15), which is the sampler's business;
- training sigmas: musubi-tuner's Krea 2 guide suggests ``timestep_sampling shift``,
  ``discrete_flow_shift 2.5`` (the pipeline's shift at 1024 x 1024) and ``weighting_scheme
  none``: the defaults here; any [flow] draw key replaces them.
"""

from __future__ import annotations

import dataclasses

from library.models.families.krea2.entry import SIGMA_KEYS
from library.training import flow_matching as fm
from library.training.objectives import FlowMatchingObjective, FlowOptions

DEFAULTS = {"timestep_sampling": "shift", "sigmoid_scale": 1.0, "discrete_flow_shift": 2.5,
            "weighting_scheme": "none", "model_prediction_type": "raw"}  # fmt: skip


def krea2_flow_options(flow: object) -> FlowOptions:
    """The set [flow] draw keys over musubi-tuner's Krea 2 defaults; the raw output is the
    prediction."""
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
        """weighting_scheme's per-sample weight (sigma_sqrt, cosmap)."""
        return fm.output_loss_weights(self.options.weighting_scheme, t)
