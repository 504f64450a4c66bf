"""Tiny Krea 2 components and a tiny diffusers Krea2Pipeline folder, built under a seed.

The components have Krea 2's module layout (single-stream blocks with grouped-query attention
and the text fusion over tapped layers, a Qwen3-VL text encoder with its vision tower, the
Qwen-Image VAE) at a fraction of the size, for offline tests; ``Krea2Pipeline.from_pretrained``
reads the folder without a network. The tokenizer is tiny_tokenizer.py's.
"""

from __future__ import annotations

import json
from pathlib import Path

from library.models.families.krea2.spec import scheduler_config
from tests.kits.flux.tiny import build_seeded
from tests.kits.krea2.tiny_tokenizer import tiny_qwen3vl_vocab_size, write_tiny_qwen3vl_tokenizer

TAPS = (1, 2, 3)  # three of the tiny Qwen3-VL's four layers (the last is never read)
TEXT_WIDTH = 32


def transformer_config() -> dict:
    """Krea2Transformer2DModel kwargs: two blocks, GQA (2 query heads, 1 key/value head), a
    one-block-each text fusion over the three taps."""
    return {
        "in_channels": 64, "num_layers": 2, "attention_head_dim": 16, "num_attention_heads": 2,
        "num_key_value_heads": 1, "intermediate_size": 64, "timestep_embed_dim": 32,
        "text_hidden_dim": TEXT_WIDTH, "num_text_layers": len(TAPS), "text_num_attention_heads": 2,
        "text_num_key_value_heads": 2, "text_intermediate_size": 64,
        "num_layerwise_text_blocks": 1, "num_refiner_text_blocks": 1, "axes_dims_rope": (4, 6, 6),
    }  # fmt: skip


def text_encoder_config() -> dict:
    """Qwen3VLConfig kwargs: a four-layer language model with grouped-query attention and the
    interleaved mRoPE split, and a one-block vision tower (loaded, never run)."""
    return {
        "text_config": {
            "vocab_size": 300, "hidden_size": TEXT_WIDTH, "intermediate_size": 64,
            "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2,
            "head_dim": 8, "max_position_embeddings": 2048,
            "rope_parameters": {"rope_theta": 5000000.0, "rope_type": "default",
                                "mrope_section": [2, 1, 1], "mrope_interleaved": True},
        },
        "vision_config": {
            "depth": 1, "hidden_size": 16, "intermediate_size": 32, "num_heads": 2,
            "out_hidden_size": TEXT_WIDTH, "deepstack_visual_indexes": [0], "patch_size": 4,
            "num_position_embeddings": 16,
        },
    }  # fmt: skip


def build_tiny_krea2_components(seed: int = 0) -> dict:
    """transformer, vae and text_encoder (Qwen3VLModel) with weights drawn under ``seed``."""
    from diffusers import AutoencoderKLQwenImage, Krea2Transformer2DModel
    from transformers import Qwen3VLConfig, Qwen3VLModel

    builders = {
        "transformer": lambda: Krea2Transformer2DModel(**transformer_config()),
        "vae": lambda: AutoencoderKLQwenImage(base_dim=8),
        "text_encoder": lambda: Qwen3VLModel(Qwen3VLConfig(**text_encoder_config())),
    }
    modules = build_seeded(builders, seed)
    if modules["text_encoder"].config.text_config.vocab_size < tiny_qwen3vl_vocab_size():
        raise ValueError("the tiny Qwen3-VL has fewer token embeddings than the tokenizer ids")
    return modules


def model_index(distilled: bool) -> dict:
    """model_index.json of a Krea 2 folder: the released classes and the pipeline's config."""
    import diffusers

    return {
        "_class_name": "Krea2Pipeline",
        "_diffusers_version": diffusers.__version__,
        "is_distilled": distilled,
        "patch_size": 2,
        "text_encoder_select_layers": list(TAPS),
        "scheduler": ["diffusers", "FlowMatchEulerDiscreteScheduler"],
        "text_encoder": ["transformers", "Qwen3VLModel"],
        "tokenizer": ["transformers", "Qwen2Tokenizer"],
        "transformer": ["diffusers", "Krea2Transformer2DModel"],
        "vae": ["diffusers", "AutoencoderKLQwenImage"],
    }


def write_tiny_krea2_folder(path: str | Path, seed: int = 0, distilled: bool = False) -> Path:
    """Write a tiny Krea 2 (RAW, or Turbo when ``distilled``) as a diffusers Krea2Pipeline
    folder; returns ``path``."""
    from diffusers import FlowMatchEulerDiscreteScheduler

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    for name, module in build_tiny_krea2_components(seed).items():
        module.save_pretrained(path / name)
    write_tiny_qwen3vl_tokenizer(path / "tokenizer")
    FlowMatchEulerDiscreteScheduler(**scheduler_config()).save_pretrained(path / "scheduler")
    text = json.dumps(model_index(distilled), indent=2) + "\n"
    (path / "model_index.json").write_text(text, encoding="utf-8")
    return path
