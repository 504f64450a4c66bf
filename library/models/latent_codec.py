"""Latent codecs: how a model family's VAE turns pixels into the denoiser's latents and back.

Training never reads a VAE's config or output type itself. It asks the family for a codec over
the loaded VAE (ModelFamily.latent_codec) and goes through it:

- ``posterior(pixels)``: the VAE posterior's (mean, std), what the latent cache stores and the
  training step samples from (mean + std * eps);
- ``to_latents(sample)``: a posterior sample (or the mean) in the denoiser's latent space;
- ``to_decoder(latents)``: the inverse, what the VAE's decoder takes;
- ``layout``: the latents' shape for an image size, without running the VAE (stand-ins for
  unreadable images, the memory estimate's meta latents).

ScaledLatentCodec is diffusers' AutoencoderKL convention, ``(z - shift_factor) *
scaling_factor`` with the factors from the VAE's config; VAEs that normalise per channel, or
that have a frame axis, bring codecs of their own.
"""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass
from typing import Protocol

import torch
from torch.amp import is_autocast_available


@dataclass(frozen=True)
class LatentLayout:
    """The shape of the latents of an image or clip: ``channels``, the spatial ``factor`` by
    which the VAE shrinks each side, and the sizes of any axes between the channel axis and the
    two spatial ones (``inner_axes``: () for an image VAE, (1,) for a video VAE's single frame).
    ``frame_factor``: how many frames after the first a video VAE folds into one latent frame
    (a clip of F frames has 1 + (F - 1) / frame_factor); 0 for a VAE without a frame axis.

    Plain data, so it travels to data-loader workers without the VAE.
    """

    channels: int
    factor: int
    inner_axes: tuple[int, ...] = ()
    frame_factor: int = 0

    @property
    def takes_clips(self) -> bool:
        """Whether the VAE encodes clips of several frames."""
        return self.frame_factor > 0

    def latent_frames(self, frames: int) -> int:
        """Latent frames of a clip of ``frames`` frames; ValueError where the VAE cannot
        encode that many (no frame axis, or not 1 + a multiple of frame_factor)."""
        if frames == 1:
            return 1
        if not self.takes_clips:
            raise ValueError(f"this VAE encodes single images, not clips of {frames} frames")
        if frames < 1 or (frames - 1) % self.frame_factor:
            nearest = 1 + self.frame_factor * max(1, (frames - 1) // self.frame_factor)
            raise ValueError(
                f"a clip of {frames} frames cannot be encoded: this VAE takes 1 + a multiple of "
                f"{self.frame_factor} frames (e.g. {nearest})"
            )
        return 1 + (frames - 1) // self.frame_factor

    def shape(self, batch: int, height: int, width: int, frames: int = 1) -> tuple[int, ...]:
        """The latents' shape for ``batch`` images (or clips of ``frames`` frames) of
        ``height`` x ``width`` pixels."""
        spatial = (height // self.factor, width // self.factor)
        inner = self.inner_axes
        if frames != 1:
            inner = (self.latent_frames(frames), *inner[1:])
        return (batch, self.channels, *inner, *spatial)

    @property
    def sample_dims(self) -> int:
        """Dimensions of one image's latents (the shape without the batch axis)."""
        return 3 + len(self.inner_axes)


class LatentCodec(Protocol):
    """What the shared training code needs of a VAE (module docstring)."""

    @property
    def layout(self) -> LatentLayout:
        """The latents' shape for an image size."""
        ...

    def posterior(self, pixels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The VAE posterior's (mean, std) in float32, each of ``layout.shape`` for ``pixels``
        [B, 3, H, W] (or, where ``layout.takes_clips``, clips [B, 3, F, H, W]) in [-1, 1] on
        the VAE's device; without gradients."""
        ...

    def to_latents(self, sample: torch.Tensor) -> torch.Tensor:
        """A posterior sample in the denoiser's latent space."""
        ...

    def to_decoder(self, latents: torch.Tensor) -> torch.Tensor:
        """Denoiser-space latents as the VAE's decoder takes them (the inverse of to_latents)."""
        ...


def vae_posterior(
    vae: torch.nn.Module, vae_input: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """(mean, std) in float32 of the diagonal Gaussian ``vae.encode(vae_input)`` gives.

    Runs without gradients in the VAE's own dtype, outside any autocast: autocast would
    recast the VAE to the mixed-precision dtype, and with no_half_vae it must stay float32.
    """
    device = vae_input.device.type
    # no autocast to leave on the meta device (the memory estimate's shapes-only encoding)
    plain = (
        torch.autocast(device, enabled=False) if is_autocast_available(device) else nullcontext()
    )
    with torch.no_grad(), plain:
        posterior = vae.encode(vae_input.to(dtype=vae.dtype)).latent_dist
    return posterior.mean.float(), posterior.std.float()


@dataclass(frozen=True)
class ScaledLatentCodec:
    """diffusers' AutoencoderKL: latents = (z - shift_factor) * scaling_factor, both factors
    read from the VAE's config on every call (SD's VAEs have no shift_factor; FLUX.1's and
    SD3's do). The latents are [B, latent_channels, H / f, W / f], f = 2 ** (levels - 1)."""

    vae: torch.nn.Module

    @property
    def layout(self) -> LatentLayout:
        config = self.vae.config
        return LatentLayout(config.latent_channels, 2 ** (len(config.block_out_channels) - 1))

    def posterior(self, pixels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return vae_posterior(self.vae, pixels)

    def to_latents(self, sample: torch.Tensor) -> torch.Tensor:
        shift = self._shift()
        # No subtraction at all without a shift, so SD's latents stay bit-for-bit what they were.
        shifted = sample - shift if shift else sample
        return shifted * self.vae.config.scaling_factor

    def to_decoder(self, latents: torch.Tensor) -> torch.Tensor:
        shift = self._shift()
        scaled = latents / self.vae.config.scaling_factor
        return scaled + shift if shift else scaled

    def _shift(self) -> float:
        return getattr(self.vae.config, "shift_factor", None) or 0.0
