"""A tiny Qwen-Image as the single files Comfy-Org distributes (files.py), for offline tests.

Written from ``build_tiny_qwenimage_components`` under a seed, so they hold the weights of
``write_tiny_qwenimage_folder`` with the same seed (in their storage dtype): the transformer in
diffusers' names, Qwen2.5-VL in the transformers names of its release (``model.layers.*``,
``visual.*``, ``lm_head.weight``), the VAE in Wan 2.1's names, and the tiny tokenizer in a
folder beside them.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from library.models.checkpoint_parts import CONFIG_METADATA
from library.models.families.name_table import CHECKPOINT_PREFIX
from library.models.wan_vae_keys import vae_to_original
from tests.kits.qwenimage.tiny import build_tiny_qwenimage_components
from tests.kits.qwenimage.tiny_shapes import (
    tiny_text_encoder_config,
    tiny_transformer_config,
    tiny_vae_config,
)
from tests.kits.qwenimage.tiny_tokenizer import write_tiny_qwen25vl_tokenizer

# Comfy-Org's file names (split_files/diffusion_models/, text_encoders/, vae/)
FILE_NAMES = {
    "transformer": "qwen_image_bf16.safetensors",
    "text_encoder": "qwen_2.5_vl_7b.safetensors",
    "vae": "qwen_image_vae.safetensors",
}


def released_text_names(state: dict) -> dict:
    """Qwen2_5_VLForConditionalGeneration's tensors in the names of its release (and of
    ComfyUI's file): ``model.<language model>``, ``visual.<vision tower>``, ``lm_head``."""
    out = {}
    for key, value in state.items():
        if key.startswith("model.language_model."):
            key = "model." + key[len("model.language_model.") :]
        elif key.startswith("model.visual."):
            key = key[len("model.") :]
        out[key] = value
    return out


def write_tiny_qwenimage_files(
    folder: str | Path,
    seed: int = 0,
    dtype: torch.dtype = torch.bfloat16,
    config_metadata: bool = True,
    transformer_prefix: str = "",
    transformer_config: dict | None = None,
) -> dict[str, Path]:
    """Write a tiny Qwen-Image as single files in ``folder``; returns their paths by role:
    "transformer", "text_encoder", "vae" and "tokenizer" (a folder).

    Tensors are stored in ``dtype``. ``config_metadata`` writes each part's exact config into
    its header (``difftune.config.<part>``); without it the loader reads the transformer's
    sizes off its shapes and takes the released text encoder and VAE configs (which the tiny
    ones are not: only the transformer file loads then). ``transformer_prefix``: "" (Comfy-Org's
    file) or files.CHECKPOINT_PREFIX. ``transformer_config``: the transformer's header config
    (default: the tiny one; an edit release's adds its flags)."""
    from safetensors.torch import save_file

    if transformer_prefix not in ("", CHECKPOINT_PREFIX):
        raise ValueError(f"transformer_prefix {transformer_prefix!r}")
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    parts = build_tiny_qwenimage_components(seed)
    states = {
        "transformer": {
            transformer_prefix + k: v for k, v in parts["transformer"].state_dict().items()
        },
        "text_encoder": released_text_names(parts["text_encoder"].state_dict()),
        "vae": vae_to_original(parts["vae"].state_dict(), tiny_vae_config()),
    }
    configs = {
        "transformer": transformer_config or tiny_transformer_config(),
        "text_encoder": tiny_text_encoder_config(),
        "vae": tiny_vae_config(),
    }
    paths = {}
    for part, name in FILE_NAMES.items():
        meta = {CONFIG_METADATA + part: json.dumps(configs[part])} if config_metadata else {}
        tensors = {k: v.detach().to(dtype).contiguous().clone() for k, v in states[part].items()}
        save_file(tensors, str(folder / name), metadata={"format": "pt", **meta})
        paths[part] = folder / name
    return {**paths, "tokenizer": write_tiny_qwen25vl_tokenizer(folder / "tokenizer")}
