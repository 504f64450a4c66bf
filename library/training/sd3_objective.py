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

import dataclasses
import logging

import torch

from library.training import flow_matching as fm
from library.training.loss import LossOptions
from library.training.noise import NoiseOptions, SampleDraws
from library.training.objectives import FlowMatchingObjective, FlowOptions

log = logging.getLogger(__name__)

# Noise keys sd-scripts' SD3 trainer does not apply (it draws plain noise).
_UNUSED_NOISE = ("ip_noise_gamma", "ip_noise_gamma_random_strength")


class SD3FlowObjective(FlowMatchingObjective):
    """Rectified flow with x0 target and SD3's timestep density (kohya's SD3 trainer)."""

    name = "flow"

    def __init__(self, options: FlowOptions, sampling_scheduler=None) -> None:
        fm.validate_flow_options(training_shift=options.training_shift)
        super().__init__(options, sampling_scheduler)
        self.min_timestep: int | None = None
        self.max_timestep: int | None = None

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

    def check(self, noise: NoiseOptions, loss: LossOptions) -> tuple[NoiseOptions, LossOptions]:
        """min/max_timestep are kept (kohya's SD3 sampler honours them); the rest as Flux,
        plus input-perturbation noise, which sd-scripts' SD3 trainer leaves out too."""
        fm.validate_flow_options(min_timestep=noise.min_timestep, max_timestep=noise.max_timestep)
        self.min_timestep = noise.min_timestep
        self.max_timestep = noise.max_timestep
        unused = {k: getattr(noise, k) for k in _UNUSED_NOISE if getattr(noise, k)}
        if unused:
            listed = ", ".join(f"{k} = {v}" for k, v in unused.items())
            log.warning(
                "%s: not used by SD3 (sd-scripts' SD3 trainer leaves it out too); training "
                "without it",
                listed,
            )
            noise = dataclasses.replace(noise, **{k: type(v)() for k, v in unused.items()})
        full = dataclasses.replace(noise, min_timestep=0, max_timestep=None)
        full, loss = super().check(full, loss)
        return dataclasses.replace(
            full, min_timestep=noise.min_timestep, max_timestep=noise.max_timestep
        ), loss

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
