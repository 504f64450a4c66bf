"""Tiny SD3 / SD3.5 models on disk, in the two forms users have them: a diffusers
StableDiffusion3Pipeline folder, and Stability AI's single file (the MMDiT under
``model.diffusion_model.`` and the VAE under ``first_stage_model.``, with the text encoders inside
under ``text_encoders.*`` or as separate clip_l, clip_g and t5xxl files) with tokenizer folders
beside it.

Both are written from ``build_tiny_sd3_components`` under the same seed, so the two routes hold
the same weights (the files in their storage dtype). diffusers' ``StableDiffusion3Pipeline
.from_pretrained`` reads the folder offline.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from library.models import original_names as names
from library.models.checkpoint_parts import CONFIG_METADATA
from library.models.families.sd3.original_keys import (
    ORIGINAL_PREFIX,
    TEXT_ENCODER_PREFIXES,
    VAE_PREFIX,
    ae_to_original,
    transformer_to_original,
)
from library.models.families.sd3.sampling import sd3_scheduler_config
from library.models.families.sd3.shapes import Variant
from tests.kits.flux.tiny import write_tiny_t5_tokenizer
from tests.kits.sd.tiny import write_tiny_tokenizer
from tests.kits.sd3.tiny import build_tiny_sd3_components
from tests.kits.sd3.tiny_shapes import (
    tiny_clip_g_config,
    tiny_clip_l_config,
    tiny_t5_config,
    tiny_transformer_config,
    tiny_vae_config,
)

SD3_PIPELINE = "StableDiffusion3Pipeline"
# The released single files' names (Stability AI's Hugging Face repositories).
FILE_STEMS: dict[str, str] = {
    "sd3-medium": "sd3_medium",
    "sd3.5-medium": "sd3.5_medium",
    "sd3.5-large": "sd3.5_large",
}
# diffusers subfolder -> the [flow] key of its separate file (and its name inside the file).
TEXT_ENCODERS = {"text_encoder": "clip_l", "text_encoder_2": "clip_g", "text_encoder_3": "t5xxl"}


def _model_index() -> dict:
    import diffusers

    return {
        "_class_name": SD3_PIPELINE,
        "_diffusers_version": diffusers.__version__,
        "scheduler": ["diffusers", "FlowMatchEulerDiscreteScheduler"],
        "text_encoder": ["transformers", "CLIPTextModelWithProjection"],
        "text_encoder_2": ["transformers", "CLIPTextModelWithProjection"],
        "text_encoder_3": ["transformers", "T5EncoderModel"],
        "tokenizer": ["transformers", "CLIPTokenizer"],
        "tokenizer_2": ["transformers", "CLIPTokenizer"],
        "tokenizer_3": ["transformers", "T5TokenizerFast"],
        "transformer": ["diffusers", "SD3Transformer2DModel"],
        "vae": ["diffusers", "AutoencoderKL"],
    }


def write_tiny_sd3_folder(
    path: str | Path, variant: Variant = "sd3.5-medium", seed: int = 0
) -> Path:
    """Write a tiny SD3 ``variant`` as a diffusers StableDiffusion3Pipeline folder; returns
    ``path``.

    transformer/, vae/, text_encoder/ (CLIP-L), text_encoder_2/ (CLIP-G), text_encoder_3/ (T5) via
    save_pretrained, tokenizer/ and tokenizer_2/ (the tiny CLIP tokenizer), tokenizer_3/ (the
    tiny T5 tokenizer), scheduler/.
    """
    from diffusers import FlowMatchEulerDiscreteScheduler

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    for name, module in build_tiny_sd3_components(variant, seed).items():
        module.save_pretrained(path / name, safe_serialization=True)
    write_tiny_tokenizer(path / "tokenizer")
    write_tiny_tokenizer(path / "tokenizer_2")
    write_tiny_t5_tokenizer(path / "tokenizer_3")
    FlowMatchEulerDiscreteScheduler(**sd3_scheduler_config()).save_pretrained(path / "scheduler")
    text = json.dumps(_model_index(), indent=2, sort_keys=True) + "\n"
    (path / "model_index.json").write_text(text, encoding="utf-8")
    return path


def tiny_original_states(variant: Variant = "sd3.5-medium", seed: int = 0) -> dict[str, dict]:
    """The tiny components' state dicts as the single files name them, by diffusers part name
    (without the prefixes of a full checkpoint): the MMDiT and the VAE in Stability's names, the
    CLIPs in transformers' ``text_model.`` names with ``text_projection.weight``, T5 with its
    embedding as ``shared.weight`` only."""
    parts = build_tiny_sd3_components(variant, seed)
    states = {
        "transformer": transformer_to_original(parts["transformer"].state_dict()),
        "vae": ae_to_original(parts["vae"].state_dict()),
    }
    for part in ("text_encoder", "text_encoder_2"):
        clip = names.with_text_model_prefix(parts[part].state_dict())
        states[part] = {k: v for k, v in clip.items() if not k.endswith("position_ids")}
    t5 = dict(parts["text_encoder_3"].state_dict())
    del t5["encoder.embed_tokens.weight"]  # the same tensor as shared.weight (tied)
    states["text_encoder_3"] = t5
    return states


def tiny_configs(variant: Variant = "sd3.5-medium") -> dict[str, dict]:
    """The tiny components' configs, by diffusers part name."""
    return {
        "transformer": tiny_transformer_config(variant),
        "vae": tiny_vae_config(),
        "text_encoder": tiny_clip_l_config(),
        "text_encoder_2": tiny_clip_g_config(),
        "text_encoder_3": tiny_t5_config(),
    }


def write_tiny_sd3_files(
    folder: str | Path,
    variant: Variant = "sd3.5-medium",
    seed: int = 0,
    *,
    text_encoders_inside: bool,
    dtype: torch.dtype = torch.bfloat16,
    fp8: bool = False,
    config_metadata: bool = True,
) -> dict[str, Path]:
    """Write a tiny SD3 ``variant`` as Stability AI ships it, in ``folder``; returns the paths by
    role.

    "model": <sd3_medium|sd3.5_medium|sd3.5_large>.safetensors with the MMDiT under
    ``model.diffusion_model.`` and the VAE under ``first_stage_model.``; with
    ``text_encoders_inside`` (named ``..._incl_clips_t5xxl``) also CLIP-L, CLIP-G and T5 under
    ``text_encoders.{clip_l,clip_g,t5xxl}.transformer.``, else "clip_l", "clip_g" and "t5xxl":
    separate files in transformers' names (as in the ``text_encoders/`` folder of Stability's
    repositories). "tokenizer": the tiny CLIP tokenizer folder (both CLIPs'); "t5_tokenizer":
    the tiny T5 tokenizer folder.
    Tensors are stored in ``dtype``; ``fp8`` stores the matrices (2-D and up) of the MMDiT and
    T5 in float8_e4m3fn and the rest in ``dtype``. ``config_metadata`` writes each part's exact
    config into its file's header (``difftune.config.<part>``); without it the loader reads the
    sizes off the shapes and has to guess what they do not show.
    """
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    states = tiny_original_states(variant, seed)
    configs = tiny_configs(variant)
    fp8_parts = ("transformer", "text_encoder_3") if fp8 else ()

    def stored(part: str, prefix: str = "") -> dict[str, torch.Tensor]:
        fp8_part = part in fp8_parts
        return {
            prefix + k: v.to(torch.float8_e4m3fn if fp8_part and v.dim() >= 2 else dtype)
            for k, v in states[part].items()
        }

    def meta(parts) -> dict[str, str]:
        return (
            {CONFIG_METADATA + p: json.dumps(configs[p]) for p in parts} if config_metadata else {}
        )

    model = {**stored("transformer", ORIGINAL_PREFIX), **stored("vae", VAE_PREFIX)}
    inside = ["transformer", "vae"]
    paths: dict[str, Path] = {}
    for part, key in TEXT_ENCODERS.items():
        if text_encoders_inside:
            model.update(stored(part, TEXT_ENCODER_PREFIXES[key]))
            inside.append(part)
        else:
            paths[key] = _save(folder / f"{key}.safetensors", stored(part), meta([part]))
    stem = FILE_STEMS[variant] + ("_incl_clips_t5xxl" if text_encoders_inside else "")
    paths["model"] = _save(folder / f"{stem}.safetensors", model, meta(inside))
    return {
        **paths,
        "tokenizer": write_tiny_tokenizer(folder / "tokenizer"),
        "t5_tokenizer": write_tiny_t5_tokenizer(folder / "t5_tokenizer"),
    }


def _save(path: Path, state: dict[str, torch.Tensor], meta: dict[str, str]) -> Path:
    from safetensors.torch import save_file

    # clone: converted tensors may be views of one another (split fused projections).
    tensors = {k: v.detach().to("cpu").contiguous().clone() for k, v in state.items()}
    save_file(tensors, str(path), metadata={"format": "pt", **meta})
    return path
