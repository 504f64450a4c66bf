"""Tiny FLUX.1 models on disk, in the two forms users have them: a diffusers FluxPipeline folder,
and separate files as Black Forest Labs and ComfyUI distribute them (a transformer file in the
original layout, clip_l, t5xxl, ae) with tokenizer folders beside them.

Both are written from ``build_tiny_flux_components`` under the same seed, so the two routes hold
the same weights (the files in their storage dtype). diffusers' ``FluxPipeline.from_pretrained``
reads the folder offline.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

import torch

from library.models import original_names as names
from library.models.checkpoint_parts import CONFIG_METADATA
from library.models.families.flux.original_keys import ae_to_original, transformer_to_original
from library.models.families.flux.sampling import flux_scheduler_config
from library.models.families.flux.shapes import Variant
from tests.kits.flux.tiny import build_tiny_flux_components, write_tiny_t5_tokenizer
from tests.kits.flux.tiny_shapes import (
    tiny_ae_config,
    tiny_clip_config,
    tiny_t5_config,
    tiny_transformer_config,
)
from tests.kits.sd.tiny import write_tiny_tokenizer

FP8 = torch.float8_e4m3fn


def pipeline_index() -> dict:
    """model_index.json of a diffusers FluxPipeline folder."""
    import diffusers

    return {
        "_class_name": "FluxPipeline",
        "_diffusers_version": diffusers.__version__,
        "scheduler": ["diffusers", "FlowMatchEulerDiscreteScheduler"],
        "text_encoder": ["transformers", "CLIPTextModel"],
        "text_encoder_2": ["transformers", "T5EncoderModel"],
        "tokenizer": ["transformers", "CLIPTokenizer"],
        "tokenizer_2": ["transformers", "T5TokenizerFast"],
        "transformer": ["diffusers", "FluxTransformer2DModel"],
        "vae": ["diffusers", "AutoencoderKL"],
    }


def write_tiny_flux_folder(path: str | Path, variant: Variant = "dev", seed: int = 0) -> Path:
    """Write a tiny FLUX.1 ``variant`` as a diffusers FluxPipeline folder; returns ``path``.

    transformer/, vae/, text_encoder/ (CLIP-L), text_encoder_2/ (T5) via save_pretrained,
    tokenizer/ (the tiny CLIP tokenizer), tokenizer_2/ (the tiny T5 tokenizer), scheduler/.
    """
    from diffusers import FlowMatchEulerDiscreteScheduler

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    for name, module in build_tiny_flux_components(variant, seed).items():
        module.save_pretrained(path / name, safe_serialization=True)
    write_tiny_tokenizer(path / "tokenizer")
    write_tiny_t5_tokenizer(path / "tokenizer_2")
    FlowMatchEulerDiscreteScheduler(**flux_scheduler_config(variant)).save_pretrained(
        path / "scheduler"
    )
    text = json.dumps(pipeline_index(), indent=2, sort_keys=True) + "\n"
    (path / "model_index.json").write_text(text, encoding="utf-8")
    return path


def write_tiny_flux_files(
    folder: str | Path,
    variant: Variant = "dev",
    seed: int = 0,
    dtype: torch.dtype = torch.bfloat16,
    fp8: bool = False,
    config_metadata: bool = True,
) -> dict[str, Path]:
    """Write a tiny FLUX.1 as separate files in ``folder``; returns their paths by role.

    "transformer": flux1-<variant>.safetensors in the original BFL layout (no prefix);
    "clip_l": transformers' CLIPTextModel names with ``text_model.``; "t5xxl": T5EncoderModel
    names with the embedding as shared.weight only; "ae": BFL's ae.safetensors names;
    "tokenizer": the tiny CLIP tokenizer folder; "t5_tokenizer": the tiny T5 tokenizer folder.
    Tensors are stored in ``dtype``; ``fp8`` stores the matrices (2-D and up) of the
    transformer and T5 in float8_e4m3fn, the storage of fp8 releases, and the rest (biases,
    norm scales) in ``dtype``, so one file mixes both.
    ``config_metadata`` writes each part's exact config into the header
    (``difftune.config.<part>``, as difftune's SD exports do); without it the loader reads the
    sizes off the shapes and has to guess CLIP's head count.
    """
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    parts = build_tiny_flux_components(variant, seed)
    configs = {
        "transformer": tiny_transformer_config(variant),
        "text_encoder": tiny_clip_config(),
        "text_encoder_2": tiny_t5_config(),
        "vae": tiny_ae_config(),
    }
    t5 = dict(parts["text_encoder_2"].state_dict())
    del t5["encoder.embed_tokens.weight"]  # the same tensor as shared.weight (tied)
    clip = names.with_text_model_prefix(parts["text_encoder"].state_dict())
    states = {
        "transformer": transformer_to_original(parts["transformer"].state_dict()),
        "text_encoder": {k: v for k, v in clip.items() if not k.endswith("position_ids")},
        "text_encoder_2": t5,
        "vae": ae_to_original(parts["vae"].state_dict()),
    }
    fp8_parts = ("transformer", "text_encoder_2") if fp8 else ()
    files = {
        "transformer": f"flux1-{variant}.safetensors",
        "text_encoder": "clip_l.safetensors",
        "text_encoder_2": "t5xxl.safetensors",
        "vae": "ae.safetensors",
    }
    paths = {}
    for part, name in files.items():
        meta = {CONFIG_METADATA + part: json.dumps(configs[part])} if config_metadata else {}
        paths[part] = _save(folder / name, states[part], dtype, part in fp8_parts, meta)
    return {
        "transformer": paths["transformer"],
        "clip_l": paths["text_encoder"],
        "t5xxl": paths["text_encoder_2"],
        "ae": paths["vae"],
        "tokenizer": write_tiny_tokenizer(folder / "tokenizer"),
        "t5_tokenizer": write_tiny_t5_tokenizer(folder / "t5_tokenizer"),
    }


def _stored(tensor: torch.Tensor, dtype: torch.dtype, fp8: bool) -> torch.Tensor:
    """A tensor as it is stored: matrices in fp8 when ``fp8``, else ``dtype``."""
    target = FP8 if fp8 and tensor.dim() >= 2 else dtype
    return tensor.detach().to("cpu", target).contiguous()


def _save(
    path: Path, state: Mapping[str, torch.Tensor], dtype, fp8: bool, meta: dict[str, str]
) -> Path:
    from safetensors.torch import save_file

    # clone: converted tensors may be views of one another (split fused projections).
    tensors = {k: _stored(v, dtype, fp8).clone() for k, v in state.items()}
    save_file(tensors, str(path), metadata={"format": "pt", **meta})
    return path
