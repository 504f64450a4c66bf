"""The loss of one micro-batch: encode, noise, predict, compare."""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass

import torch

from library.models.text import encode_prompts
from library.training.loss import min_snr_weight, signal_to_noise, weighted_loss
from library.training.noise import draw


@dataclass
class StepInputs:
    """What the loss needs besides the batch; built once by the trainer."""

    unet: torch.nn.Module  # the prepared (possibly DDP-wrapped) module whose forward runs
    vae: torch.nn.Module
    text_encoder: torch.nn.Module  # prepared when it carries a trained adapter
    tokenizer: object
    noise_scheduler: object  # diffusers DDPMScheduler
    v_prediction: bool
    train_text_encoder: bool
    weight_dtype: torch.dtype
    device: torch.device
    seed: int
    noise_offset: float
    min_snr_gamma: float | None


def micro_batch_loss(s: StepInputs, batch: dict) -> torch.Tensor:
    """Loss of one micro-batch, with every random draw keyed by (seed, epoch, position)."""
    pixels = batch["pixel_values"].to(s.device, dtype=s.weight_dtype)
    with torch.no_grad():
        posterior = s.vae.encode(pixels).latent_dist
    mean, std = posterior.mean.float(), posterior.std.float()
    draws = draw(
        s.seed,
        batch["epoch"],
        batch["positions"].tolist(),
        tuple(mean.shape[1:]),
        s.noise_scheduler.config.num_train_timesteps,
        s.device,
    )
    latents = (mean + std * draws.latent_eps) * s.vae.config.scaling_factor
    noise = draws.noise
    if s.noise_offset:
        noise = noise + s.noise_offset * draws.offset
    timesteps = draws.timesteps
    noisy = s.noise_scheduler.add_noise(latents, noise, timesteps)

    grad_context = nullcontext() if s.train_text_encoder else torch.no_grad()
    with grad_context:
        hidden = encode_prompts(s.tokenizer, s.text_encoder, batch["captions"], s.device)
    prediction = s.unet(noisy.to(s.weight_dtype), timesteps, hidden.to(s.weight_dtype)).sample

    target = s.noise_scheduler.get_velocity(latents, noise, timesteps) if s.v_prediction else noise
    snr_weights = None
    if s.min_snr_gamma:
        snr = signal_to_noise(s.noise_scheduler.alphas_cumprod, timesteps)
        snr_weights = min_snr_weight(snr, s.min_snr_gamma, s.v_prediction)
    return weighted_loss(prediction, target, batch["loss_weights"], snr_weights)
