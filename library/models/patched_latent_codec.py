"""Latents patched into channels and normalised by the VAE's BatchNorm running statistics: the
codec of a VAE that keeps its latents' statistics in a BatchNorm (``vae.bn``), as FLUX.2's
AutoencoderKLFlux2 does (32 channels, patched 2x2 into 128; diffusers 0.42.1,
Flux2KleinPipeline._encode_vae_image and the end of __call__):

- encode: z = the VAE posterior (32 x H/8 x W/8), patched 2x2 (channel c, row offset i, column
  offset j -> channel 4c + 2i + j: 128 x H/16 x W/16), then (z - running_mean) /
  sqrt(running_var + batch_norm_eps) per channel;
- decode: the inverse, then the VAE's decoder;
- the transformer reads each latent pixel as one token (its patch_size is 1), so an image side
  must be a multiple of 16 pixels (the VAE's 8 times the 2x2 patch).

The posterior is patched before sampling (a permutation of its values), so the latent cache and
the training step keep it in the denoiser's layout.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from library.models.latent_codec import LatentLayout, vae_posterior
from library.models.patch_tokens import pack_latents, unpack_latents


def patchify(latents: torch.Tensor) -> torch.Tensor:
    """[B, C, h, w] -> [B, 4C, h/2, w/2]: the 2x2 patch tokens (channel-major) laid out as a
    latent (FLUX.2's pipelines' _patchify_latents)."""
    b, c, h, w = latents.shape
    return pack_latents(latents).transpose(1, 2).reshape(b, 4 * c, h // 2, w // 2)


def unpatchify(latents: torch.Tensor) -> torch.Tensor:
    """The inverse of ``patchify``."""
    b, c, h, w = latents.shape
    return unpack_latents(latents.flatten(2).transpose(1, 2), c // 4, 2 * h, 2 * w)


@dataclass(frozen=True)
class BatchNormPatchedCodec:
    """A BatchNorm-normalising VAE's latents, patched 2x2, in the denoiser's space (module
    docstring)."""

    vae: torch.nn.Module

    @property
    def layout(self) -> LatentLayout:
        config = self.vae.config
        return LatentLayout(config.latent_channels * 4, 2 ** len(config.block_out_channels))

    def posterior(self, pixels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        mean, std = vae_posterior(self.vae, pixels)
        return patchify(mean), patchify(std)

    def _stats(self, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        bn = self.vae.bn
        mean = bn.running_mean.view(1, -1, 1, 1).to(like.device, like.dtype)
        std = torch.sqrt(bn.running_var.view(1, -1, 1, 1) + self.vae.config.batch_norm_eps)
        return mean, std.to(like.device, like.dtype)

    def to_latents(self, sample: torch.Tensor) -> torch.Tensor:
        mean, std = self._stats(sample)
        return (sample - mean) / std

    def to_decoder(self, latents: torch.Tensor) -> torch.Tensor:
        mean, std = self._stats(latents)
        return unpatchify(latents * std + mean)
