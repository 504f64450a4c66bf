"""The loaded parts of one model, as every family's loader returns them."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from library.models.experts import Experts
from library.models.families.base import ModelFamily
from library.models.image_encoders.clip_vision import ImageEncoder


@dataclass
class Components:
    """The loaded parts of one model. Every module is frozen (requires_grad False), on the CPU,
    in the weight dtype it was loaded with (the VAE in float32 with no_half_vae), in eval mode.

    ``denoiser`` is the network that is trained (a UNet, or a transformer); ``text_encoders``
    and ``tokenizers`` are in ``family.text_encoder_subfolders`` order; ``objective``
    (library.training.objectives) says how the denoiser is trained and sampled. ``model_dir``
    is the diffusers folder, or the checkpoint file of a single-file model. ``experts``: a
    model with several denoiser experts (library.models.experts; ``denoiser`` is then its
    low-noise expert), else None. ``image_encoder``: the image encoder whose states of the
    sample's first frame condition the denoiser beside the caption (an ImageEncoder of
    library.models.image_encoders.clip_vision), else None.
    """

    denoiser: torch.nn.Module
    vae: torch.nn.Module
    text_encoders: tuple[torch.nn.Module, ...]
    tokenizers: tuple[object, ...]
    objective: object
    family: ModelFamily
    model_dir: Path
    experts: Experts | None = None
    image_encoder: ImageEncoder | None = None

    @property
    def text_encoder(self) -> torch.nn.Module:
        """The first text encoder."""
        return self.text_encoders[0]

    @property
    def tokenizer(self) -> object:
        """The first tokenizer."""
        return self.tokenizers[0]

    @property
    def is_single_file(self) -> bool:
        """The model came from one checkpoint file (there is no folder to copy parts from)."""
        return self.model_dir.is_file()
