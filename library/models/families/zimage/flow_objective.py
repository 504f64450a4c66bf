"""Z-Image's training objective: the shared rectified flow in Z-Image's own conventions.

The noise levels, noising and loss machinery are the shared FlowMatchingObjective's
(library.training.objectives); three facts differ (objective.py states them):

- the transformer's timestep input is 1 - sigma (0 at pure noise), not sigma;
- its raw output is x0 - noise, the negated velocity, and is compared with that target as it
  is (musubi-tuner's Z-Image trainer: no model_prediction_type);
- the unset [flow] keys take musubi-tuner's suggested Z-Image draw (``shift`` sampling,
  discrete_flow_shift 2.0, no loss weighting), not kohya's Flux.1 defaults; a weighting_scheme of
  sigma_sqrt or cosmap weights the loss per sample, as musubi-tuner's trainers do.
"""

from __future__ import annotations

import dataclasses

from library.models.families.zimage import objective as facts
from library.models.families.zimage.entry import SIGMA_KEYS
from library.models.families.zimage.shapes import PATCH_SIZE
from library.training import flow_matching as fm
from library.training.objectives import FlowMatchingObjective, FlowOptions


def zimage_flow_options(flow: object) -> FlowOptions:
    """The objective's options: the set [flow] keys over musubi-tuner's Z-Image defaults."""
    given = {key: getattr(flow, key) for key in SIGMA_KEYS if getattr(flow, key, None) is not None}
    # the raw output is the prediction: model_prediction_type is not a Z-Image key
    defaults = {**facts.DEFAULT_SIGMA_SAMPLING, "model_prediction_type": "raw"}
    return dataclasses.replace(FlowOptions(), **{**defaults, **given})


class ZImageFlowObjective(FlowMatchingObjective):
    """Rectified flow with Z-Image's timestep input (1 - sigma) and target (x0 - noise)."""

    LABEL = "Z-Image"

    def __init__(self, options: FlowOptions, sampling_scheduler=None) -> None:
        super().__init__(options, sampling_scheduler, patch=PATCH_SIZE)

    def describe(self) -> str:
        return (
            f"rectified flow, x0 - noise target at timestep 1 - sigma, timestep_sampling "
            f"{self.sampling_text()}, weighting_scheme {self.options.weighting_scheme}"
        )

    def target(self, latents, noise, t):
        return facts.training_target(latents, noise)

    def model_time(self, t):
        return facts.model_timestep(t)

    def prediction(self, output, noisy, t):
        return output

    def level_weights(self, options, t):
        """weighting_scheme's per-sample weight (sigma_sqrt: sigma^-2, cosmap)."""
        return fm.output_loss_weights(self.options.weighting_scheme, t)
