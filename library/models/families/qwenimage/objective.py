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

from library.models.families.qwenimage.shapes import PATCH_SIZE
from library.models.families.transformer_family import TrainerDraw
from library.training.objectives import FlowOptions, VelocityObjective, shift_draw

DISCRETE_FLOW_SHIFT = 2.2  # musubi-tuner's suggested Qwen-Image training draw
# The objective's options are the set [flow] keys over it (the raw output is the prediction);
# files record the draw keys.
DRAW = TrainerDraw(shift_draw(DISCRETE_FLOW_SHIFT))


class QwenImageFlowObjective(VelocityObjective):
    """Rectified flow: sigma in, velocity noise - x0 out."""

    LABEL = "Qwen-Image"

    def __init__(self, options: FlowOptions, sampling_scheduler=None) -> None:
        super().__init__(options, sampling_scheduler, patch=PATCH_SIZE)
