"""The latent codec of a video VAE that normalises each latent channel by its own mean and std.

Such a VAE (diffusers' AutoencoderKLQwenImage, for one) encodes clips [B, 3, F, H, W] into
latents [B, z_dim, F', H / f, W / f], F' = 1 + (F - 1) / t for the temporal factor t (4 for Wan's
and Qwen-Image's VAE, which are one network); an image is a clip of one frame and gives one
latent frame. Its config carries per-channel ``latents_mean`` and ``latents_std``, and diffusers'
pipelines normalise with them where AutoencoderKL uses one scale and shift.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from library.models.latent_codec import LatentLayout, vae_posterior

FRAME_AXIS = 2  # [B, C, F, h, w]


@dataclass(frozen=True)
class ChannelNormalizedVideoCodec:
    """latents = (z - latents_mean[c]) / latents_std[c] per channel c, over clips; an image
    [B, 3, H, W] is encoded as a clip of one frame.

    The spatial factor is the config's scale_factor_spatial where it has one (Wan 2.2's VAE: 16,
    its 2x2 pixel patches included), else 2 ** len(temperal_downsample): every level that may
    downsample in time halves the image sides, as diffusers' pipelines reckon it; the temporal
    factor is 2 to the number of levels that do (diffusers' vae_scale_factor_temporal).
    """

    vae: torch.nn.Module

    @property
    def layout(self) -> LatentLayout:
        config = self.vae.config
        downsample = config.temperal_downsample
        spatial = getattr(config, "scale_factor_spatial", 2 ** len(downsample))
        return LatentLayout(
            config.z_dim, spatial, inner_axes=(1,), frame_factor=2 ** sum(downsample)
        )

    def posterior(self, pixels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        clips = pixels if pixels.dim() == 5 else pixels.unsqueeze(FRAME_AXIS)
        self.layout.latent_frames(clips.shape[FRAME_AXIS])  # a count the VAE cannot fold: named
        return vae_posterior(self.vae, clips)

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


def first_frame_pixels(clips: torch.Tensor) -> torch.Tensor:
    """What an image-to-video pipeline encodes as its condition from clips [..., 3, F, H, W]:
    each clip's first frame followed by zeros (mid-grey in [-1, 1]) to its frame count
    (diffusers' WanImageToVideoPipeline.prepare_latents, musubi-tuner's I2V latent cache)."""
    condition = torch.zeros_like(clips)
    condition[..., :1, :, :] = clips[..., :1, :, :]
    return condition
