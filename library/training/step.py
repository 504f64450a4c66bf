"""The loss of one micro-batch: encode, noise, predict, compare."""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from library.models import conditioning
from library.models.conditioning import Conditioning, encode_conditioning
from library.models.family import SD1, ModelFamily
from library.training.loss import LossOptions, diffusion_loss
from library.training.noise import NoiseOptions, draw, training_noise


@dataclass
class StepInputs:
    """What the loss needs besides the batch; built once by the trainer.

    ``noise`` and ``loss`` carry the noise and loss keys of the config (``NoiseOptions`` /
    ``LossOptions.from_training(config.training)``). Building it checks them against the model
    (prediction type, timestep count).
    """

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
    noise: NoiseOptions = field(default_factory=NoiseOptions)
    loss: LossOptions = field(default_factory=LossOptions)
    clip_skip: int | None = None
    # What conditions the UNet: the family's text encoders (prepared where trained), in
    # family.text_encoder_subfolders order; empty means (text_encoder,) and (tokenizer,).
    family: ModelFamily = SD1
    text_encoders: tuple[torch.nn.Module, ...] = ()
    tokenizers: tuple[object, ...] = ()
    max_token_length: int | None = None
    # UNet-only training with cache_text_encoder_outputs: a TextEncoderCache, else None.
    text_cache: object | None = None

    def __post_init__(self) -> None:
        self.loss.check(self.v_prediction)
        self.text_encoders = tuple(self.text_encoders) or (self.text_encoder,)
        self.tokenizers = tuple(self.tokenizers) or (self.tokenizer,)
        self.noise.timestep_range(self.noise_scheduler.config.num_train_timesteps)


def batch_posterior(s: StepInputs, batch: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """The VAE posterior's (mean, std) [B, 4, h, w] in float32: cached in the batch
    ("latent_means"/"latent_stds", see library.data.dataset) or encoded from its pixels."""
    if "latent_means" in batch:
        mean = batch["latent_means"].to(s.device, dtype=torch.float32)
        return mean, batch["latent_stds"].to(s.device, dtype=torch.float32)
    # The VAE runs in its own dtype (float32 with no_half_vae), outside the step's autocast,
    # which would otherwise recast it to the mixed-precision dtype.
    pixels = batch["pixel_values"].to(s.device, dtype=s.vae.dtype)
    with torch.no_grad(), torch.autocast(s.device.type, enabled=False):
        posterior = s.vae.encode(pixels).latent_dist
    return posterior.mean.float(), posterior.std.float()


def batch_conditioning(s: StepInputs, batch: dict) -> Conditioning:
    """The UNet conditioning of the batch's captions (and SDXL sizes), from the text-encoder
    cache when there is one."""
    if s.text_cache is not None:

        def encode(captions: list[str]):
            with torch.no_grad():
                return conditioning.encode_text(
                    s.family,
                    s.tokenizers,
                    s.text_encoders,
                    captions,
                    s.device,
                    s.clip_skip,
                    s.max_token_length,
                )

        text = s.text_cache.get(list(batch["captions"]), batch.get("cache_roots"), encode)
        return conditioning.assemble_conditioning(s.family, text, batch, s.device, s.weight_dtype)
    grad_context = nullcontext() if s.train_text_encoder else torch.no_grad()
    with grad_context:
        return encode_conditioning(
            s.family,
            s.tokenizers,
            s.text_encoders,
            batch["captions"],
            s.device,
            batch,
            s.weight_dtype,
            s.clip_skip,
            max_token_length=s.max_token_length,
        )


def latent_mask(batch: dict, latent_shape: torch.Size) -> torch.Tensor | None:
    """The batch's alpha masks [B, 1, H, W] averaged down to the latents' size, or None."""
    masks = batch.get("alpha_masks")
    if masks is None:
        return None
    return F.interpolate(masks.float(), size=tuple(latent_shape[-2:]), mode="area")


def predict(s: StepInputs, noisy: torch.Tensor, timesteps: torch.Tensor, cond: Conditioning):
    """The UNet's prediction for noisy latents (in the weight dtype)."""
    return s.unet(
        noisy.to(s.weight_dtype), timesteps, cond.encoder_hidden_states, **cond.unet_kwargs
    ).sample


def training_target(s: StepInputs, latents, noise, timesteps) -> torch.Tensor:
    """What the UNet learns to predict: the noise, or the velocity for v-prediction."""
    return s.noise_scheduler.get_velocity(latents, noise, timesteps) if s.v_prediction else noise


def micro_batch_loss(s: StepInputs, batch: dict) -> torch.Tensor:
    """Loss of one micro-batch, with every random draw keyed by (seed, epoch, position)."""
    mean, std = batch_posterior(s, batch)
    draws = draw(
        s.seed,
        batch["epoch"],
        batch["positions"].tolist(),
        tuple(mean.shape[1:]),
        s.noise_scheduler.config.num_train_timesteps,
        s.device,
        s.noise,
    )
    latents = (mean + std * draws.latent_eps) * s.vae.config.scaling_factor
    noise, input_noise = training_noise(draws, latents, s.noise)
    timesteps = draws.timesteps
    noisy = s.noise_scheduler.add_noise(latents, input_noise, timesteps)
    prediction = predict(s, noisy, timesteps, batch_conditioning(s, batch))
    return diffusion_loss(
        prediction,
        training_target(s, latents, noise, timesteps),
        timesteps,
        batch["loss_weights"],
        s.loss,
        s.noise_scheduler.alphas_cumprod,
        s.v_prediction,
        latent_mask(batch, latents.shape),
    )
