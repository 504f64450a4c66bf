"""The DDPM objective of an SD 1.x/2.x/SDXL model, over its noise schedule (both loaders')."""

from __future__ import annotations

from library.models.families.base import ModelFamily
from library.training.objectives import DDPMObjective


def ddpm_objective(scheduler_config: dict, family: ModelFamily, zero_terminal_snr: bool = False):
    """The DDPM training objective over ``build_noise_scheduler``'s scheduler."""
    scheduler = build_noise_scheduler(scheduler_config, family, zero_terminal_snr)
    return DDPMObjective(scheduler, family.v_parameterization)


def build_noise_scheduler(
    scheduler_config: dict, family: ModelFamily, zero_terminal_snr: bool = False
):
    """A DDPMScheduler with the model's beta schedule; training needs only its alphas_cumprod,
    add_noise and get_velocity, whatever sampler the folder ships for inference.

    ``zero_terminal_snr`` rescales the betas so that alphas_cumprod ends at exactly 0 (diffusers'
    rescale_betas_zero_snr, Lin et al. 2023, algorithm 1).
    """
    from diffusers import DDPMScheduler

    return DDPMScheduler.from_config(
        scheduler_config,
        prediction_type=family.prediction_type,
        rescale_betas_zero_snr=zero_terminal_snr,
    )
