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
    """The shape of the latents of an image: ``channels``, the spatial ``factor`` by which the
    VAE shrinks each side, and the sizes of any axes between the channel axis and the two
    spatial ones (``inner_axes``: () for an image VAE, (1,) for a video VAE's single frame).

    Plain data, so it travels to data-loader workers without the VAE.
    """

    channels: int
    factor: int
    inner_axes: tuple[int, ...] = ()

    def shape(self, batch: int, height: int, width: int) -> tuple[int, ...]:
        """The latents' shape for ``batch`` images of ``height`` x ``width`` pixels."""
        spatial = (height // self.factor, width // self.factor)
        return (batch, self.channels, *self.inner_axes, *spatial)

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
        [B, 3, H, W] in [-1, 1] on the VAE's device; without gradients."""
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
    plain = torch.autocast(device, enabled=False) if is_autocast_available(device) else nullcontext()
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
