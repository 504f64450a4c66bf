"""The tiny Krea 2 as the single files users have: the transformer in Krea's original names
(raw.safetensors' layout, no prefix; ``comfy``: under ComfyUI's model.diffusion_model.), Qwen3-VL
in transformers' names (Comfy-Org's qwen3vl_4b_bf16.safetensors: model.language_model.*,
model.visual.*, lm_head.weight), the VAE in Wan 2.1's names (qwen_image_vae.safetensors) and
the tokenizer folder."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file

from library.models.checkpoint_parts import CONFIG_METADATA
from library.models.families.krea2.keys import TABLE
from library.models.families.name_table import CHECKPOINT_PREFIX
from library.models.wan_vae_keys import vae_to_original
from tests.kits.krea2.tiny import build_tiny_krea2_components, text_encoder_config
from tests.kits.krea2.tiny_tokenizer import write_tiny_qwen3vl_tokenizer


def _save(state: dict, path: Path, dtype: torch.dtype, config=None, part="") -> Path:
    """``state`` in ``dtype``; ``config``: the part's exact config in the header, as difftune's
    own files carry it (the released sizes would not fit a tiny model)."""
    meta = {CONFIG_METADATA + part: json.dumps(config, default=list)} if config else {}
    tensors = {k: v.detach().to(dtype).contiguous() for k, v in state.items()}
    save_file(tensors, str(path), metadata={"format": "pt", **meta})
    return path


def write_tiny_krea2_files(path, seed=0, dtype=torch.float32, comfy=False) -> dict[str, Path]:
    """Write the four under ``path``; returns their paths by part."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    modules = build_tiny_krea2_components(seed)
    head = CHECKPOINT_PREFIX if comfy else ""
    original = {
        head + k: v for k, v in TABLE.to_original(modules["transformer"].state_dict()).items()
    }
    encoder = modules["text_encoder"]
    text = {"model." + k: v for k, v in encoder.state_dict().items()}
    text["lm_head.weight"] = encoder.language_model.embed_tokens.weight.clone()
    vae = modules["vae"]
    return {
        "transformer": _save(original, path / "raw.safetensors", dtype),
        "text_encoder": _save(
            text, path / "qwen3vl_4b.safetensors", dtype, text_encoder_config(), "text_encoder"
        ),
        "vae": _save(
            vae_to_original(vae.state_dict(), vae.config),
            path / "vae.safetensors",
            dtype,
            dict(vae.config),
            "vae",
        ),  # fmt: skip
        "tokenizer": write_tiny_qwen3vl_tokenizer(path / "tokenizer"),
    }
