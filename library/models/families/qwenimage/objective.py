"""Qwen-Image's training objective: the shared rectified flow, with musubi-tuner's draw.

The facts (diffusers 0.42.1 QwenImagePipeline with FlowMatchEulerDiscreteScheduler):

- x_t = (1 - sigma) * x0 + sigma * noise (sigma 1 = pure noise);
- the transformer's timestep input is the scheduler's timestep / 1000 = sigma;
- its output goes to ``scheduler.step`` as it is, whose Euler update x + (sigma_next - sigma) * v
  follows the straight path only for v = noise - x0: the output is the **velocity noise - x0**,
  the shared FlowMatchingObjective's target (no sign flip, unlike Z-Image);
- sampling shifts sigma by the image's size (``use_dynamic_shifting``: the pipeline's
  ``calculate_shift`` gives mu linear in the image token count, the scheduler maps
  s -> e^mu / (e^mu + 1/s - 1)), which is the sampler's business, not training's;
- training sigmas: musubi-tuner's Qwen-Image guide suggests ``timestep_sampling shift``,
  ``discrete_flow_shift 2.2``, ``weighting_scheme none`` (sigma = shift(sigmoid(z))); those are
  the defaults here, and any [flow] draw key may replace them; a weighting_scheme of
  sigma_sqrt or cosmap weights the loss per sample, as musubi-tuner's trainers do.
"""

from __future__ import annotations

import dataclasses

from library.models.families.qwenimage.shapes import PATCH_SIZE
from library.training import flow_matching as fm
from library.training.objectives import FlowMatchingObjective, FlowOptions

# The [flow] keys of the draw (the shared flow-matching keys)
SIGMA_KEYS = frozenset(
    {
        "timestep_sampling",
        "sigmoid_scale",
        "discrete_flow_shift",
        "weighting_scheme",
        "logit_mean",
        "logit_std",
        "mode_scale",
    }
)
DEFAULT_SIGMA_SAMPLING = {
    "timestep_sampling": "shift",
    "sigmoid_scale": 1.0,
    "discrete_flow_shift": 2.2,
    "weighting_scheme": "none",
}


def qwenimage_flow_options(flow: object) -> FlowOptions:
    """The objective's options: the set [flow] keys over musubi-tuner's Qwen-Image defaults; the
    raw output is the prediction."""
    given = {key: getattr(flow, key) for key in SIGMA_KEYS if getattr(flow, key, None) is not None}
    defaults = {**DEFAULT_SIGMA_SAMPLING, "model_prediction_type": "raw"}
    return dataclasses.replace(FlowOptions(), **{**defaults, **given})


class QwenImageFlowObjective(FlowMatchingObjective):
    """Rectified flow: sigma in, velocity noise - x0 out."""

    LABEL = "Qwen-Image"

    def __init__(self, options: FlowOptions, sampling_scheduler=None) -> None:
        super().__init__(options, sampling_scheduler, patch=PATCH_SIZE)

    def describe(self) -> str:
        return (
            f"rectified flow, velocity target at timestep sigma, timestep_sampling "
            f"{self.sampling_text()}, weighting_scheme {self.options.weighting_scheme}"
        )

    def prediction(self, output, noisy, t):
        return output

    def level_weights(self, options, t):
        """weighting_scheme's per-sample weight (sigma_sqrt: sigma^-2, cosmap)."""
        return fm.output_loss_weights(self.options.weighting_scheme, t)
