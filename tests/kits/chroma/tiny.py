"""Tiny Chroma components and a tiny diffusers ChromaPipeline folder, built under a seed.

The transformer has Chroma's module layout (double and single blocks without modulation Linears,
the distilled guidance layer) at a fraction of the size; the AE, T5 encoder and T5 tokenizer are
FLUX.1's tiny ones (tests/kits/flux/tiny.py). ``ChromaPipeline.from_pretrained``
reads the folder offline.
"""

from __future__ import annotations

import json
from pathlib import Path

from library.models.families.chroma.shapes import SCHEDULER_CONFIG
from tests.kits.chroma.tiny_shapes import tiny_transformer_config
from tests.kits.flux.tiny import build_seeded, write_tiny_t5_tokenizer
from tests.kits.flux.tiny_shapes import tiny_ae_config, tiny_t5_config


def build_tiny_chroma_components(seed: int = 0) -> dict:
    """transformer, vae and text_encoder (T5EncoderModel) with weights drawn under ``seed``,
    each from its own seed offset, constant parameters spread."""
    from diffusers import AutoencoderKL, ChromaTransformer2DModel
    from transformers import T5Config, T5EncoderModel

    builders = {
        "transformer": lambda: ChromaTransformer2DModel(**tiny_transformer_config()),
        "vae": lambda: AutoencoderKL(**tiny_ae_config()),
        "text_encoder": lambda: T5EncoderModel(T5Config(**tiny_t5_config())),
    }
    return build_seeded(builders, seed)


def model_index() -> dict:
    """model_index.json of a Chroma folder: the classes lodestones/Chroma1-HD names."""
    import diffusers

    return {
        "_class_name": "ChromaPipeline",
        "_diffusers_version": diffusers.__version__,
        "scheduler": ["diffusers", "FlowMatchEulerDiscreteScheduler"],
        "text_encoder": ["transformers", "T5EncoderModel"],
        "tokenizer": ["transformers", "T5TokenizerFast"],
        "transformer": ["diffusers", "ChromaTransformer2DModel"],
        "vae": ["diffusers", "AutoencoderKL"],
        "image_encoder": [None, None],
        "feature_extractor": [None, None],
    }


def write_tiny_chroma_folder(path: str | Path, variant: str = "chroma", seed: int = 0) -> Path:
    """Write a tiny Chroma as a diffusers ChromaPipeline folder; returns ``path``.

    transformer/, vae/, text_encoder/ (T5) via save_pretrained, tokenizer/ (the tiny T5
    tokenizer), scheduler/ and model_index.json."""
    from diffusers import FlowMatchEulerDiscreteScheduler

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    for name, module in build_tiny_chroma_components(seed).items():
        module.save_pretrained(path / name, safe_serialization=True)
    write_tiny_t5_tokenizer(path / "tokenizer")
    FlowMatchEulerDiscreteScheduler(**SCHEDULER_CONFIG).save_pretrained(path / "scheduler")
    text = json.dumps(model_index(), indent=2, sort_keys=True) + "\n"
    (path / "model_index.json").write_text(text, encoding="utf-8")
    return path
