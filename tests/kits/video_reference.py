"""What the plain reference losses of the families on the channel-normalised video VAE (Qwen-Image,
Krea 2, Wan) write out alike, from the pipeline's parts and facts: the VAE's posterior of the
clip (an image: one frame), sampled with the trainer's keyed draws, normalised per channel
((z - latents_mean) / latents_std), and musubi-tuner's "shift" sigma draw noising it."""

from __future__ import annotations

import torch

from library.training.noise import NoiseOptions, draw


def shifted_clip(vae, batch, seed: int, shift: float):
    """(x0, the draws, sigma [B]) of the batch's clips [B, 3, F, H, W] (images [B, 3, H, W]:
    one-frame clips)."""
    pixels = batch["pixel_values"]
    posterior = vae.encode(pixels if pixels.dim() == 5 else pixels.unsqueeze(2)).latent_dist
    shape = tuple(posterior.mean.shape[1:])
    d = draw(seed, batch["epoch"], batch["positions"].tolist(), shape, 1000,
             torch.device("cpu"), NoiseOptions(), flow_times=True)  # fmt: skip
    z = posterior.mean + posterior.std * d.latent_eps
    mean = torch.tensor(vae.config.latents_mean).view(1, -1, 1, 1, 1)
    std = torch.tensor(vae.config.latents_std).view(1, -1, 1, 1, 1)
    x0 = (z - mean) / std
    u = torch.sigmoid(d.time_normal)
    sigma = shift * u / (1 + (shift - 1) * u)
    return x0, d, sigma
