"""Z-Image's training objective: the shared rectified flow with its timestep and sign, and
musubi-tuner's draw.

The facts (diffusers 0.42.1 ZImagePipeline with FlowMatchEulerDiscreteScheduler):

- Noise level sigma in [0, 1]: x_t = (1 - sigma) * x0 + sigma * noise (sigma 1 = pure noise).
- The scheduler's timesteps are sigma * 1000; the pipeline feeds the transformer
  (1000 - timestep) / 1000 = **1 - sigma**, so the model sees 0 at pure noise and 1 at the clean
  image (the reverse of FLUX.1's sigma).
- The pipeline negates the output before ``scheduler.step``, whose Euler update is
  x_next = x_t + (sigma_next - sigma) * v. For that to follow the straight path, v must be the
  velocity d x_t / d sigma = noise - x0, so the transformer's **raw output is x0 - noise**: the
  training target in the model's output space (musubi-tuner trains on latents - noise with the
  raw output; ai-toolkit negates the output and trains on noise - latents: the same objective).
  Both are the shared NegatedVelocityObjective's.
- Sampling sigmas: linspace(1, 1/N, N), then the scheduler's static shift
  s' = shift * s / (1 + (shift - 1) * s) (3.0 for Turbo, 6.0 for Base), then 0 appended. The
  pipeline's calculate_shift ``mu`` is ignored, the released schedulers having
  use_dynamic_shifting false; the pipeline samples, so this is its business, not training's.
- Training sigmas: neither release documents its training distribution. musubi-tuner's Z-Image
  guide suggests ``timestep_sampling shift``, ``discrete_flow_shift 2.0``, ``weighting_scheme
  none`` (sigma = shift(sigmoid(z)), z standard normal); ai-toolkit's Z-Image examples draw from
  its flow-matching scheduler with the Turbo shift 3.0 and ``timestep_type weighted``. The
  defaults here are musubi-tuner's, and any [flow] draw key may replace them; a
  weighting_scheme of sigma_sqrt or cosmap weights the loss per sample, as musubi-tuner's
  trainers do.
"""

from __future__ import annotations

from library.models.families.transformer_family import TrainerDraw
from library.models.families.zimage.shapes import PATCH_SIZE
from library.training.objectives import FlowOptions, NegatedVelocityObjective, shift_draw

DISCRETE_FLOW_SHIFT = 2.0  # musubi-tuner's suggested Z-Image training draw (docs/zimage.md)
# The objective's options are the set [flow] keys over it (the raw output is the prediction:
# model_prediction_type is not a Z-Image key); files record the draw keys.
DRAW = TrainerDraw(shift_draw(DISCRETE_FLOW_SHIFT))


class ZImageFlowObjective(NegatedVelocityObjective):
    """Rectified flow: 1 - sigma in, x0 - noise out."""

    LABEL = "Z-Image"

    def __init__(self, options: FlowOptions, sampling_scheduler=None) -> None:
        super().__init__(options, sampling_scheduler, patch=PATCH_SIZE)
