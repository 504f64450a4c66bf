"""The latent codec of a video VAE that normalises each latent channel by its own mean and std.

Such a VAE (diffusers' AutoencoderKLQwenImage, for one) encodes clips [B, 3, F, H, W] into
latents [B, z_dim, F', H / f, W / f]; an image is a clip of one frame and gives one latent
frame. Its config carries per-channel ``latents_mean`` and ``latents_std``, and diffusers'
pipelines normalise with them where AutoencoderKL uses one scale and shift.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from library.models.latent_codec import LatentLayout, vae_posterior

FRAME_AXIS = 2  # [B, C, F, h, w]


@dataclass(frozen=True)
class ChannelNormalizedVideoCodec:
    """latents = (z - latents_mean[c]) / latents_std[c] per channel c, over one-frame clips.

    The spatial factor is 2 ** len(temperal_downsample): every level that may downsample in time
    halves the image sides, as diffusers' pipelines reckon it.
    """

    vae: torch.nn.Module

    @property
    def layout(self) -> LatentLayout:
        config = self.vae.config
        return LatentLayout(config.z_dim, 2 ** len(config.temperal_downsample), inner_axes=(1,))

    def posterior(self, pixels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return vae_posterior(self.vae, pixels.unsqueeze(FRAME_AXIS))

    def to_latents(self, sample: torch.Tensor) -> torch.Tensor:
        mean, std = self._statistics(sample)
        return (sample - mean) / std

    def to_decoder(self, latents: torch.Tensor) -> torch.Tensor:
        mean, std = self._statistics(latents)
        return latents * std + mean

    def _statistics(self, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The config's per-channel mean and std, shaped to broadcast over ``like``'s channel
        axis (1), in its dtype and on its device."""
        shape = (1, -1, *([1] * (like.dim() - 2)))
        config = self.vae.config
        return tuple(
            torch.tensor(values, dtype=like.dtype, device=like.device).view(shape)
            for values in (config.latents_mean, config.latents_std)
        )
