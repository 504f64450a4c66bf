"""Tiny Z-Image components and a tiny diffusers ZImagePipeline folder, built under a seed.

The components have Z-Image's module layout (refiner and joint single-stream blocks, a Qwen3
text encoder, FLUX.1's 16-channel AE) at a fraction of the size, for offline tests;
``ZImagePipeline.from_pretrained(folder)`` reads the folder without a network.
"""

from __future__ import annotations

import json
from pathlib import Path

from library.models.families.zimage.shapes import Variant, scheduler_config
from tests.kits.flux.tiny import build_seeded
from tests.kits.zimage.tiny_shapes import (
    tiny_ae_config,
    tiny_text_encoder_config,
    tiny_transformer_config,
)
from tests.kits.zimage.tiny_tokenizer import write_tiny_qwen3_tokenizer


def build_tiny_zimage_components(seed: int = 0) -> dict:
    """transformer, vae and text_encoder (Qwen3Model) with weights drawn under ``seed``, each
    from its own seed offset; constant parameters (norm scales, the zero pad tokens) are spread
    so that a swap of two of them shows."""
    from diffusers import AutoencoderKL, ZImageTransformer2DModel
    from transformers import Qwen3Config, Qwen3Model

    builders = {
        "transformer": lambda: ZImageTransformer2DModel(**tiny_transformer_config()),
        "vae": lambda: AutoencoderKL(**tiny_ae_config()),
        "text_encoder": lambda: Qwen3Model(Qwen3Config(**tiny_text_encoder_config())),
    }
    return build_seeded(builders, seed)


def model_index() -> dict:
    """model_index.json of a Z-Image folder: the classes the released repositories name."""
    import diffusers

    return {
        "_class_name": "ZImagePipeline",
        "_diffusers_version": diffusers.__version__,
        "scheduler": ["diffusers", "FlowMatchEulerDiscreteScheduler"],
        "text_encoder": ["transformers", "Qwen3Model"],
        "tokenizer": ["transformers", "Qwen2Tokenizer"],
        "transformer": ["diffusers", "ZImageTransformer2DModel"],
        "vae": ["diffusers", "AutoencoderKL"],
    }


def write_tiny_zimage_folder(path: str | Path, variant: Variant = "turbo", seed: int = 0) -> Path:
    """Write a tiny Z-Image ``variant`` as a diffusers ZImagePipeline folder; returns ``path``.

    transformer/, vae/, text_encoder/ via save_pretrained (float32), tokenizer/ (the tiny Qwen3
    tokenizer), scheduler/ (the variant's released scheduler config) and model_index.json.
    """
    from diffusers import FlowMatchEulerDiscreteScheduler

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    for name, module in build_tiny_zimage_components(seed).items():
        module.save_pretrained(path / name)
    write_tiny_qwen3_tokenizer(path / "tokenizer")
    FlowMatchEulerDiscreteScheduler(**scheduler_config(variant)).save_pretrained(path / "scheduler")
    text = json.dumps(model_index(), indent=2) + "\n"
    (path / "model_index.json").write_text(text, encoding="utf-8")
    return path
