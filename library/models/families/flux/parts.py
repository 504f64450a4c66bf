"""The loaded modules of one FLUX.1 model, before its family and objective are chosen, and the
check both its loaders (a diffusers folder, the single files) make on the transformer first."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from library.errors import ModelError
from library.models.families.flux import shapes as flux_shapes


@dataclass
class FluxParts:
    """The modules and tokenizers of one FLUX.1 model, before family and objective are chosen."""

    transformer: torch.nn.Module
    vae: torch.nn.Module
    clip_l: torch.nn.Module
    t5: torch.nn.Module
    clip_tokenizer: object
    t5_tokenizer: object
    variant: str  # "dev" or "schnell"
    model_dir: Path  # the diffusers folder, or the transformer file


def refuse_channels(where: Path, channels: int) -> None:
    expected = flux_shapes.transformer_config()["in_channels"]
    if channels != expected:
        raise ModelError(
            f"{where} takes {channels} input channels (FLUX.1 Fill or Depth?); only text-to-image "
            f"FLUX.1 models with {expected} (16 latent channels, 2x2 packed) can be trained"
        )
