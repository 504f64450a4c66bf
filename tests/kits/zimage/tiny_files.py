"""A tiny Z-Image as the single files Comfy-Org distributes (files.py), for offline tests.

Written from ``build_tiny_zimage_components`` under a seed, so they hold the weights of
``write_tiny_zimage_folder`` with the same seed (in their storage dtype): the transformer in
the original names, Qwen3 in transformers' names under ``model.``, the AE in Black Forest Labs'
names, and the tiny Qwen3 tokenizer in a folder beside them.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from library.models.checkpoint_parts import CONFIG_METADATA
from library.models.families.flux.original_keys import ae_to_original
from library.models.families.zimage import keys
from library.models.families.zimage.shapes import Variant
from tests.kits.zimage.tiny import build_tiny_zimage_components
from tests.kits.zimage.tiny_shapes import (
    tiny_ae_config,
    tiny_text_encoder_config,
    tiny_transformer_config,
)
from tests.kits.zimage.tiny_tokenizer import write_tiny_qwen3_tokenizer

# Comfy-Org's file names (split_files/diffusion_models/, text_encoders/, vae/)
TRANSFORMER_FILES = {"turbo": "z_image_turbo_bf16.safetensors", "base": "z_image_bf16.safetensors"}


def write_tiny_zimage_files(
    folder: str | Path,
    variant: Variant = "turbo",
    seed: int = 0,
    dtype: torch.dtype = torch.bfloat16,
    config_metadata: bool = True,
    transformer_prefix: str = "",
    text_prefix: str = "model.",
) -> dict[str, Path]:
    """Write a tiny Z-Image ``variant`` as single files in ``folder``; returns their paths by
    role: "transformer", "text_encoder", "ae" and "tokenizer" (a folder).

    Tensors are stored in ``dtype``. ``config_metadata`` writes each part's exact config into
    its header (``difftune.config.<part>``); without it the loader reads the sizes off the
    shapes. ``transformer_prefix`` ("" or keys.CHECKPOINT_PREFIX) and ``text_prefix``
    ("model." as qwen_3_4b.safetensors, or "") prefix the two files' keys.
    """
    from safetensors.torch import save_file

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    parts = build_tiny_zimage_components(seed)
    states = {
        "transformer": keys.diffusers_to_original(
            parts["transformer"].state_dict(), transformer_prefix
        ),
        "text_encoder": {text_prefix + k: v for k, v in parts["text_encoder"].state_dict().items()},
        "vae": ae_to_original(parts["vae"].state_dict()),
    }
    configs = {
        "transformer": tiny_transformer_config(),
        "text_encoder": tiny_text_encoder_config(),
        "vae": tiny_ae_config(),
    }
    names = {
        "transformer": TRANSFORMER_FILES[variant],
        "text_encoder": "qwen_3_4b.safetensors",
        "vae": "ae.safetensors",
    }
    paths = {}
    for part, name in names.items():
        meta = {CONFIG_METADATA + part: json.dumps(configs[part])} if config_metadata else {}
        # clone: the fused qkv pieces and converted tensors may share storage
        tensors = {k: v.detach().to(dtype).contiguous().clone() for k, v in states[part].items()}
        save_file(tensors, str(folder / name), metadata={"format": "pt", **meta})
        paths[part] = folder / name
    return {
        "transformer": paths["transformer"],
        "text_encoder": paths["text_encoder"],
        "ae": paths["vae"],
        "tokenizer": write_tiny_qwen3_tokenizer(folder / "tokenizer"),
    }
