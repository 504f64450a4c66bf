"""A tiny Toy as a ToyPipeline folder and as single files, from the same seeded components.

The transformer is 1 double + 1 single block at width 32 reading the tiny T5's 48-wide states;
the AE, T5 encoder and tokenizer are FLUX.1's tiny ones (tests/kits/flux/)."""

from __future__ import annotations

import json
from pathlib import Path

from library.models.plans import CONFIG_METADATA
from tests.kits.flux.tiny import build_seeded, write_tiny_t5_tokenizer
from tests.kits.flux.tiny_shapes import TINY_T5_WIDTH, tiny_ae_config, tiny_t5_config
from tests.kits.toy.family import SCHEDULER
from tests.kits.toy.spec import PIPELINE, TABLE


def tiny_transformer_config() -> dict:
    return {
        "patch_size": 1,
        "in_channels": 64,  # 16 latent channels in 2x2 patches
        "num_layers": 1,
        "num_single_layers": 1,
        "attention_head_dim": 16,
        "num_attention_heads": 2,
        "joint_attention_dim": TINY_T5_WIDTH,
        "axes_dims_rope": (4, 6, 6),
    }


def build_tiny_toy(seed: int = 0) -> dict:
    from diffusers import AutoencoderKL, BriaTransformer2DModel
    from transformers import T5Config, T5EncoderModel

    return build_seeded(
        {
            "transformer": lambda: BriaTransformer2DModel(**tiny_transformer_config()),
            "vae": lambda: AutoencoderKL(**tiny_ae_config()),
            "text_encoder": lambda: T5EncoderModel(T5Config(**tiny_t5_config())),
        },
        seed,
    )


def write_tiny_toy_folder(path: Path, seed: int = 0) -> Path:
    """transformer/, vae/, text_encoder/, tokenizer/, scheduler/ and a ToyPipeline
    model_index.json."""
    from diffusers import FlowMatchEulerDiscreteScheduler

    path.mkdir(parents=True, exist_ok=True)
    for name, module in build_tiny_toy(seed).items():
        module.save_pretrained(path / name, safe_serialization=True)
    write_tiny_t5_tokenizer(path / "tokenizer")
    FlowMatchEulerDiscreteScheduler(**SCHEDULER).save_pretrained(path / "scheduler")
    index = {
        "_class_name": PIPELINE,
        "transformer": ["diffusers", "BriaTransformer2DModel"],
        "vae": ["diffusers", "AutoencoderKL"],
        "text_encoder": ["transformers", "T5EncoderModel"],
        "tokenizer": ["transformers", "T5TokenizerFast"],
        "scheduler": ["diffusers", "FlowMatchEulerDiscreteScheduler"],
    }
    (path / "model_index.json").write_text(json.dumps(index, indent=2), encoding="utf-8")
    return path


def write_tiny_toy_files(folder: Path, seed: int = 0) -> dict[str, Path]:
    """The transformer in Toy's original names (no config in its header: the loader reads the
    sizes off the shapes), the T5 encoder and the AE (in diffusers' names) as FLUX.1's t5xxl
    and ae files carry them, and T5's tokenizer; paths by role."""
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    parts = build_tiny_toy(seed)
    t5 = dict(parts["text_encoder"].state_dict())
    del t5["encoder.embed_tokens.weight"]  # the same tensor as shared.weight (tied)
    states = {
        "transformer": (TABLE.to_original(parts["transformer"].state_dict()), None),
        "t5xxl": (t5, ("text_encoder_2", tiny_t5_config())),
        "ae": (parts["vae"].state_dict(), ("vae", tiny_ae_config())),
    }
    paths = {}
    for role, (state, config) in states.items():
        meta = {"format": "pt"}
        if config:
            meta[CONFIG_METADATA + config[0]] = json.dumps(config[1])
        paths[role] = folder / f"{role}.safetensors"
        tensors = {k: v.detach().contiguous().clone() for k, v in state.items()}
        save_file(tensors, str(paths[role]), metadata=meta)
    paths["t5_tokenizer"] = write_tiny_t5_tokenizer(folder / "t5_tokenizer")
    return paths


def write_tiny_toy_experts_folder(path: Path, boundary_ratio: float | None, seed: int = 0) -> Path:
    """A Toy folder with two experts, as diffusers' Wan 2.2 A14B folders hold them: the
    high-noise transformer in transformer/, a low-noise one (other weights) in transformer_2/,
    and ``boundary_ratio`` (None: left out) in model_index.json."""
    from diffusers import BriaTransformer2DModel

    write_tiny_toy_folder(path, seed)
    low = build_seeded({"transformer_2": lambda: BriaTransformer2DModel(**tiny_transformer_config())}, seed + 1)
    low["transformer_2"].save_pretrained(path / "transformer_2", safe_serialization=True)
    index = json.loads((path / "model_index.json").read_text(encoding="utf-8"))
    index["transformer_2"] = ["diffusers", "BriaTransformer2DModel"]
    if boundary_ratio is not None:
        index["boundary_ratio"] = boundary_ratio
    (path / "model_index.json").write_text(json.dumps(index, indent=2), encoding="utf-8")
    return path
