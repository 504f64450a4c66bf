"""Tiny Qwen-Image components and a tiny diffusers QwenImagePipeline folder, built under a seed.

The components have Qwen-Image's module layout (dual-stream blocks, a Qwen2.5-VL text encoder
with its vision tower, the 16-channel video VAE) at a fraction of the size, for offline tests;
``QwenImagePipeline.from_pretrained(folder)`` reads the folder without a network. The tokenizer
is tiny_tokenizer.py's Qwen2.5-VL-style one.
"""

from __future__ import annotations

import json
from pathlib import Path

from library.models.families.qwenimage.shapes import scheduler_config
from tests.kits.flux.tiny import build_seeded
from tests.kits.qwenimage.tiny_shapes import (
    tiny_text_encoder_config,
    tiny_transformer_config,
    tiny_vae_config,
)
from tests.kits.qwenimage.tiny_tokenizer import (
    tiny_vocab,
    write_tiny_qwen25vl_tokenizer,
)


def build_tiny_qwenimage_components(seed: int = 0) -> dict:
    """transformer, vae and text_encoder (Qwen2_5_VLForConditionalGeneration) with weights drawn
    under ``seed``, each from its own seed offset."""
    from diffusers import AutoencoderKLQwenImage, QwenImageTransformer2DModel
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

    def text_encoder():
        config = Qwen2_5_VLConfig(**tiny_text_encoder_config())
        return Qwen2_5_VLForConditionalGeneration(config)

    builders = {
        "transformer": lambda: QwenImageTransformer2DModel(**tiny_transformer_config()),
        "vae": lambda: AutoencoderKLQwenImage(**tiny_vae_config()),
        "text_encoder": text_encoder,
    }
    modules = build_seeded(builders, seed)
    vocab = modules["text_encoder"].config.text_config.vocab_size
    if vocab < len(tiny_vocab()):
        raise ValueError(f"{vocab} token embeddings: fewer than the tiny tokenizer's ids")
    return modules


def model_index() -> dict:
    """model_index.json of a Qwen-Image folder: the classes the released repository names."""
    import diffusers

    return {
        "_class_name": "QwenImagePipeline",
        "_diffusers_version": diffusers.__version__,
        "scheduler": ["diffusers", "FlowMatchEulerDiscreteScheduler"],
        "text_encoder": ["transformers", "Qwen2_5_VLForConditionalGeneration"],
        "tokenizer": ["transformers", "Qwen2Tokenizer"],
        "transformer": ["diffusers", "QwenImageTransformer2DModel"],
        "vae": ["diffusers", "AutoencoderKLQwenImage"],
    }


def write_tiny_qwenimage_folder(path: str | Path, seed: int = 0) -> Path:
    """Write a tiny Qwen-Image as a diffusers QwenImagePipeline folder; returns ``path``.

    transformer/, vae/, text_encoder/ via save_pretrained (float32), tokenizer/ (the tiny
    tokenizer), scheduler/ (the released scheduler config) and model_index.json.
    """
    from diffusers import FlowMatchEulerDiscreteScheduler

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    for name, module in build_tiny_qwenimage_components(seed).items():
        module.save_pretrained(path / name)
    write_tiny_qwen25vl_tokenizer(path / "tokenizer")
    FlowMatchEulerDiscreteScheduler(**scheduler_config()).save_pretrained(path / "scheduler")
    text = json.dumps(model_index(), indent=2) + "\n"
    (path / "model_index.json").write_text(text, encoding="utf-8")
    return path
