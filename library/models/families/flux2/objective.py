"""FLUX.2's training objective: FLUX.1's rectified flow, with the image's token count of FLUX.2.

The facts (diffusers 0.42.1 Flux2KleinPipeline / Flux2Pipeline with
FlowMatchEulerDiscreteScheduler): x_t = (1 - sigma) x0 + sigma noise; the transformer takes
sigma (the pipeline passes the scheduler's timestep / 1000) and its raw output is the velocity
noise - x0 (the scheduler steps x + (sigma_next - sigma) * output). The sampling sigmas are
shifted by exp(mu), mu from the image's token count and the step count (compute_empirical_mu).

Training draws: musubi-tuner's FLUX.2 guide trains with ``timestep_sampling flux2_shift``:
sigmoid(z) shifted by exp(mu), mu FLUX.1's line through (256, 0.5) and (4096, 1.15) at the
image's token count (one token per 16 x 16 pixels here, h * w of the patched latent). That is
``flux_shift`` on FLUX.2's tokens, the default here; the raw output is the prediction
(``model_prediction_type`` raw) with no loss weighting, as musubi-tuner trains.
"""

from __future__ import annotations

from library.training import flow_matching as fm
from library.training.objectives import FlowOptions, VelocityObjective, flow_options_over

DEFAULTS = {"timestep_sampling": "flux_shift", "weighting_scheme": "none",
            "model_prediction_type": "raw"}  # fmt: skip


def flux2_flow_options(flow: object) -> FlowOptions:
    """The objective's options: the set [flow] keys over musubi-tuner's FLUX.2 draw."""
    return flow_options_over(flow, DEFAULTS)


class Flux2FlowObjective(VelocityObjective):
    """The shared velocity objective with FLUX.2's token count (one token per latent pixel: its
    codec patchifies) and its pipelines' timestep input."""

    LABEL = "FLUX.2"

    def __init__(self, options: FlowOptions, sampling_scheduler=None) -> None:
        super().__init__(options, sampling_scheduler, patch=1)

    def model_time(self, t):
        # as the pipeline computes it from the scheduler's timestep (sigma * 1000) / 1000
        return fm.sigma_to_timestep(t) / fm.NUM_TRAIN_TIMESTEPS
