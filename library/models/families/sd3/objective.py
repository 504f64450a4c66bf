"""SD3/SD3.5's rectified-flow objective, as kohya-ss sd-scripts' sd3_train_network trains it.

It differs from Flux's (library.training.objectives.FlowMatchingObjective) in four facts:

- the noise level: ``weighting_scheme``'s density of the draws, shifted by ``training_shift``,
  scaled into [min_timestep, max_timestep) and floored to an integer timestep t; sigma = t / 1000
  (library.training.flow_matching.sd3_sample_sigmas). min/max_timestep apply here;
- the prediction is the x0 estimate ``x_t - sigma * output`` (EDM's preconditioning) and the
  target is the clean latent x0, whatever other option is set; the loss is weighted per sample
  by ``weighting_scheme`` (sigma_sqrt: sigma^-2, cosmap);
- no input-perturbation noise (ip_noise_gamma): sd-scripts' SD3 trainer does not apply it;
- the denoiser is given t = sigma * 1000 (the family converts; levels stay sigmas here).
"""

from __future__ import annotations

import torch

from library.models.families.sd3.shapes import PATCH_SIZE
from library.training import flow_matching as fm
from library.training.noise import SampleDraws
from library.training.objectives import DDPM_NOISE_KEYS, FlowMatchingObjective, FlowOptions


class SD3FlowObjective(FlowMatchingObjective):
    """Rectified flow with x0 target and SD3's timestep density (kohya's SD3 trainer)."""

    name = "flow"
    LABEL = "SD3"
    UNUSED_NOISE_KEYS = (*DDPM_NOISE_KEYS, "ip_noise_gamma", "ip_noise_gamma_random_strength")
    TIMESTEP_RANGE = True  # kohya's SD3 sampler honours min/max_timestep

    def __init__(self, options: FlowOptions, sampling_scheduler=None) -> None:
        fm.validate_flow_options(training_shift=options.training_shift)
        super().__init__(options, sampling_scheduler, patch=PATCH_SIZE)

    def describe(self) -> str:
        o = self.options
        density = o.weighting_scheme
        if density == "logit_normal":
            density += f" (mean {o.logit_mean:g}, std {o.logit_std:g})"
        elif density == "mode":
            density += f" (scale {o.mode_scale:g})"
        low = self.min_timestep or 0
        high = fm.NUM_TRAIN_TIMESTEPS if self.max_timestep is None else self.max_timestep
        span = f", timesteps {low}..{high}" if (low, high) != (0, fm.NUM_TRAIN_TIMESTEPS) else ""
        return (
            f"rectified flow, x0 target (x_t - sigma * output), weighting_scheme {density}, "
            f"training_shift {o.training_shift:g}{span}"
        )

    def levels(self, draws: SampleDraws, latent_shape: tuple[int, ...]) -> torch.Tensor:
        o = self.options
        return fm.sd3_sample_sigmas(
            draws.time_normal,
            draws.time_uniform,
            weighting_scheme=o.weighting_scheme,
            logit_mean=o.logit_mean,
            logit_std=o.logit_std,
            mode_scale=o.mode_scale,
            training_shift=o.training_shift,
            min_timestep=self.min_timestep,
            max_timestep=self.max_timestep,
        ).sigmas

    def target(self, latents, noise, t):
        return latents

    def prediction(self, output, noisy, t):
        return fm.apply_model_prediction_type(
            output, noisy.to(output.dtype), t, "sigma_scaled"
        ).prediction

    def level_weights(self, options, t):
        """weighting_scheme's loss weight. sigma_sqrt's sigma^-2 is infinite at sigma 0 (drawn
        when min_timestep is 0), where the x0 prediction is exact and the loss 0: weight 0 there
        (sd-scripts' loss becomes NaN)."""
        scheme = self.options.weighting_scheme
        if scheme not in ("sigma_sqrt", "cosmap"):
            return None
        weights = fm.loss_weighting(scheme, t)
        return torch.where(t > 0, weights, torch.zeros_like(weights))
