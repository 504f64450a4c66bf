"""What a weights file holds, told by its key names, for errors about a file given in the wrong
place or one no family reads."""

from __future__ import annotations

import re
from collections.abc import Iterable

from library.models.families.flux.original_keys import detect_flux
from library.models.families.sd3.original_keys import detect_sd3


def sample_keys(keys: Iterable[str]) -> str:
    """The first two key names, for errors about a file that holds something else."""
    first = sorted(keys)[:2]
    return f"keys like {', '.join(first)}" if first else "no tensors"


def looks_like(keys: list[str]) -> str:
    """What a file holds, by its key names, for errors about a file given in the wrong place."""
    if detect_sd3(keys) is not None:
        return "an SD3 / SD3.5 model file"
    if detect_flux(keys) is not None:
        return "a FLUX.1 transformer"
    if any(".SelfAttention." in k for k in keys):
        return "a T5 encoder"
    if any(k.startswith("model.diffusion_model.input_blocks.") for k in keys):
        return "an SD UNet checkpoint"
    if any(k.endswith("embeddings.token_embedding.weight") for k in keys):
        return "a CLIP text encoder"
    if any(re.match(r"(first_stage_model\.|vae\.)?encoder\.down(_blocks)?\.0\.", k) for k in keys):
        return "an autoencoder"
    return sample_keys(keys)
