"""The loaded modules of one SD3/SD3.5 model, before its family and objective are chosen, and the
check both its loaders (a diffusers folder, the single files) make on the transformer first."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from library.errors import ModelError
from library.models.families.sd3 import shapes as sd3_shapes


@dataclass
class SD3Parts:
    """What an SD3 loader (a diffusers folder, or the single files) returns.

    ``variant`` is "sd3-medium", "sd3.5-medium" or "sd3.5-large"
    (library.models.families.sd3.shapes); ``model_dir`` is the diffusers folder, or the MMDiT
    checkpoint file.
    """

    transformer: torch.nn.Module  # diffusers SD3Transformer2DModel
    vae: torch.nn.Module  # diffusers AutoencoderKL, 16 latent channels
    clip_l: torch.nn.Module  # transformers CLIPTextModelWithProjection
    clip_g: torch.nn.Module  # transformers CLIPTextModelWithProjection
    t5: torch.nn.Module  # transformers T5EncoderModel
    clip_l_tokenizer: object
    clip_g_tokenizer: object
    t5_tokenizer: object
    variant: str
    model_dir: Path


def refuse_channels(where: Path, channels: int) -> None:
    expected = sd3_shapes.LATENT_CHANNELS
    if channels != expected:
        raise ModelError(
            f"{where} takes {channels} input channels (an inpainting or control model?); only "
            f"text-to-image SD3 / SD3.5 models with {expected} (the VAE's latents) can be trained"
        )
