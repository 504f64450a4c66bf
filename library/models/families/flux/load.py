"""Loading FLUX.1 (dev / schnell): which models are FLUX.1, and a diffusers FluxPipeline folder.

The folder is read with from_pretrained after every part and weights file is checked; the
[flow] clip_l, t5xxl and ae files replace its parts when set. A single transformer file with its
separate clip_l, t5xxl and ae files is read by library/models/families/flux/files.py; the
tokenizers are found by tokenizers.py.
"""

from __future__ import annotations

import re
from pathlib import Path

import torch

from library.config.flow_schema import FlowSection
from library.config.schema import ModelSection
from library.models.families.claims import (
    checked_pipeline_folder,
    claims_model,
    part_config,
    part_source,
    without,
)
from library.models.families.file_plans import load_plan
from library.models.families.flux import shapes as flux_shapes
from library.models.families.flux.family import flux_family
from library.models.families.flux.files import check_widths, component_plans, load_flux_files
from library.models.families.flux.original_keys import detect_flux
from library.models.families.flux.parts import FluxParts, refuse_channels
from library.models.families.flux.sampling import flux_scheduler_config
from library.models.families.flux.tokenizers import folder_t5_tokenizer
from library.models.loader import Components, load_weights, offline
from library.models.tokenizers import folder_tokenizer
from library.training.objectives import FlowMatchingObjective, FlowOptions

FLUX_PIPELINE = "FluxPipeline"
# Key names a damaged FLUX.1 transformer file's header text shows (original or diffusers names).
_DAMAGED_MARKS = re.compile(
    r'"(model\.diffusion_model\.)?(double|single)_blocks\.\d+\.|"single_transformer_blocks\.\d+\.'
)
_TRANSFORMER_CLASS = "FluxTransformer2DModel"
# Subfolder -> the file that must be in it. tokenizer_2 (T5) is checked on its own: the CLIP
# tokenizer check would ask a T5 folder for vocab.json + merges.txt.
_REQUIRED = {
    "transformer": "config.json",
    "vae": "config.json",
    "text_encoder": "config.json",
    "text_encoder_2": "config.json",
    "tokenizer": None,
}
# The folder's part each [flow] component file replaces.
_REPLACES = {"clip_l": "text_encoder", "t5xxl": "text_encoder_2", "ae": "vae"}
# Weights file stem per subfolder (loader.find_weights' names).
_STEMS = {
    "transformer": "diffusion_pytorch_model",
    "vae": "diffusion_pytorch_model",
    "text_encoder": "model",
    "text_encoder_2": "model",
}


# --- which models are FLUX.1 ------------------------------------------------------------------


def claims_flux(model: ModelSection, flow: FlowSection) -> bool:
    """True for a FLUX.1 diffusers folder or a .safetensors file holding a FLUX.1 transformer.

    Reads only model_index.json or the file's header. A folder counts when its pipeline class
    is FluxPipeline or its transformer a FluxTransformer2DModel (so FLUX.1 Fill, Kontext, ...
    get load_flux's refusal rather than the SD loader's "lacks unet/"); a damaged file counts
    when its header text shows FLUX.1's block names (so its error names FLUX.1).
    """
    return claims_model(model, FLUX_PIPELINE, _TRANSFORMER_CLASS, detect_flux, _DAMAGED_MARKS)


# --- loading ------------------------------------------------------------------------------------


def load_flux(
    model: ModelSection, flow: FlowSection, weight_dtype: torch.dtype, vae_dtype: torch.dtype
) -> Components:
    """Components of a FLUX.1 dev or schnell model: a diffusers folder or a transformer file.

    Text encoders and tokenizers are (CLIP-L, T5). Every module is frozen, in eval mode, on the
    CPU, in ``weight_dtype`` (the AE in ``vae_dtype``). ModelError for any problem with the files.
    """
    parts = load_flux_parts(model, flow, weight_dtype, vae_dtype)
    return Components(
        denoiser=parts.transformer,
        vae=parts.vae,
        text_encoders=(parts.clip_l, parts.t5),
        tokenizers=(parts.clip_tokenizer, parts.t5_tokenizer),
        objective=FlowMatchingObjective(
            FlowOptions.from_section(flow), flux_scheduler_config(parts.variant)
        ),
        family=flux_family(parts.variant, flow),
        model_dir=parts.model_dir,
    )


def load_flux_parts(
    model: ModelSection, flow: FlowSection, weight_dtype: torch.dtype, vae_dtype: torch.dtype
) -> FluxParts:
    """The modules and tokenizers of ``load_flux``, with the variant the model is."""
    path = Path(model.pretrained_model_name_or_path).expanduser().absolute()
    if path.is_dir():
        return _load_folder(path, model, flow, weight_dtype, vae_dtype)
    return load_flux_files(path, model, flow, weight_dtype, vae_dtype)


def freeze(*modules: torch.nn.Module) -> None:
    for module in modules:
        module.requires_grad_(False)
        module.eval()


# --- a diffusers folder -------------------------------------------------------------------------


def _load_folder(
    path: Path, model: ModelSection, flow: FlowSection, weight_dtype: torch.dtype,
    vae_dtype: torch.dtype,
) -> FluxParts:  # fmt: skip
    """A FluxPipeline folder. A [flow] clip_l, t5xxl or ae file replaces the folder's part, and
    t5_tokenizer_path (tokenizer_path) its T5 (CLIP) tokenizer, as for the single files; the
    parts replaced need not be in the folder."""
    from diffusers import AutoencoderKL, FluxTransformer2DModel
    from transformers import CLIPTextModel, T5EncoderModel

    plans = component_plans(flow)  # the [flow] files set, each header read and checked
    skip = {_REPLACES[key] for key in plans} | ({"tokenizer"} if model.tokenizer_path else set())
    model_dir, t5_tokenizer_dir, config = checked_pipeline_folder(
        path, without(_REQUIRED, skip), without(_STEMS, skip), FLUX_PIPELINE,
        None if flow.t5_tokenizer_path else "tokenizer_2", "FLUX.1 (dev or schnell)",
    )  # fmt: skip
    refuse_channels(model_dir / "transformer", config.get("in_channels", 64))
    variant = "dev" if config.get("guidance_embeds", False) else "schnell"
    clip_config, t5_config = (
        part_config(plans, key, model_dir / _REPLACES[key], base)
        for key, base in (
            ("clip_l", flux_shapes.clip_l_config),
            ("t5xxl", flux_shapes.t5_xxl_config),
        )
    )
    check_widths(
        model_dir / "transformer", {**flux_shapes.transformer_config(variant), **config},
        (part_source(plans, "clip_l", model_dir / "text_encoder"), clip_config),
        (part_source(plans, "t5xxl", model_dir / "text_encoder_2"), t5_config),
    )  # fmt: skip
    with offline():
        # Tokenizers first: a broken one fails in a second, not after the weights.
        clip_tokenizer = folder_tokenizer(
            model_dir, "tokenizer", "clip", 0, model.tokenizer_path, clip_config, "CLIP-L"
        )
        t5_tokenizer = folder_t5_tokenizer(
            model_dir, t5_tokenizer_dir, flow.t5_tokenizer_path, t5_config, "tokenizer_2"
        )
        transformer = load_weights(
            FluxTransformer2DModel, model_dir, "transformer", weight_dtype, _STEMS["transformer"]
        )
        vae, clip_l, t5 = (
            load_plan(plans[key], dtype) if key in plans
            else load_weights(cls, model_dir, _REPLACES[key], dtype, _STEMS[_REPLACES[key]])
            for key, cls, dtype in (
                ("ae", AutoencoderKL, vae_dtype),
                ("clip_l", CLIPTextModel, weight_dtype),
                ("t5xxl", T5EncoderModel, weight_dtype),
            )
        )  # fmt: skip
    freeze(transformer, vae, clip_l, t5)
    return FluxParts(transformer, vae, clip_l, t5, clip_tokenizer, t5_tokenizer, variant, model_dir)

