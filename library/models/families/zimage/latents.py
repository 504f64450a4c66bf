"""Z-Image's latent space: FLUX.1's 16-channel AE with its scaling and shift factors.

The pipelines (diffusers 0.42.1) go between the VAE's latents z and the transformer's latents
with the VAE config's factors (0.3611 and 0.1159 in the release): ZImageImg2ImgPipeline encodes
(z - shift_factor) * scaling_factor, ZImagePipeline decodes latents / scaling_factor +
shift_factor. The VAE downsamples by 8 (2 ** (levels - 1)); with the transformer's 2x2
patches an image side must be a multiple of 16 pixels.
"""

from __future__ import annotations

import torch

SIZE_MULTIPLE = 16  # pixels: the VAE's 8 times the 2x2 patch


def to_model_latents(vae: torch.nn.Module, z: torch.Tensor) -> torch.Tensor:
    """The VAE's latents (a posterior sample or mode) in the transformer's space."""
    return (z - vae.config.shift_factor) * vae.config.scaling_factor


def to_vae_latents(vae: torch.nn.Module, latents: torch.Tensor) -> torch.Tensor:
    """The transformer's latents back in the VAE's space, ready for ``vae.decode``."""
    return latents / vae.config.scaling_factor + vae.config.shift_factor
