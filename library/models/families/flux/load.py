"""Loading FLUX.1 (dev / schnell): which models are FLUX.1, and a diffusers FluxPipeline folder.

The folder is declared as data (FOLDER) for the shared folder loader (folder_loader.py), which
checks every part and weights file before reading them with from_pretrained; the [flow] clip_l,
t5xxl and ae files replace its parts when set. A single transformer file with its
separate clip_l, t5xxl and ae files is read by library/models/families/flux/files.py; the
tokenizers are found by tokenizers.py.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import torch

from library.config.flow_schema import FlowSection
from library.config.schema import ModelSection
from library.models.families.claims import claims_model
from library.models.families.flux import shapes as flux_shapes
from library.models.families.flux.family import flux_family
from library.models.families.flux.files import check_widths, load_flux_files, plan_flow_file
from library.models.families.flux.original_keys import detect_flux
from library.models.families.flux.parts import FluxParts, refuse_channels
from library.models.families.flux.sampling import flux_scheduler_config
from library.models.families.flux.tokenizers import find_t5_tokenizer_folder, missing_t5_tokenizer
from library.models.families.folder_loader import (
    CheckedFolder,
    FolderPart,
    PipelineFolder,
    clip_tokenizer,
    load_folder,
    t5_tokenizer,
)
from library.models.loader import Components
from library.training.objectives import FlowMatchingObjective, FlowOptions

FLUX_PIPELINE = "FluxPipeline"
# Key names a damaged FLUX.1 transformer file's header text shows (original or diffusers names).
_DAMAGED_MARKS = re.compile(
    r'"(model\.diffusion_model\.)?(double|single)_blocks\.\d+\.|"single_transformer_blocks\.\d+\.'
)
_TRANSFORMER_CLASS = "FluxTransformer2DModel"


# --- which models are FLUX.1 ------------------------------------------------------------------


def claims_flux(model: ModelSection, flow: FlowSection) -> bool:
    """True for a FLUX.1 diffusers folder or a .safetensors file holding a FLUX.1 transformer.

    Reads only model_index.json or the file's header. A folder counts when its pipeline class
    is FluxPipeline or its transformer a FluxTransformer2DModel (so FLUX.1 Fill, Kontext, ...
    get load_flux's refusal rather than the SD loader's "lacks unet/"); a damaged file counts
    when its header text shows FLUX.1's block names (so its error names FLUX.1).
    """
    return claims_model(
        model, FLUX_PIPELINE, _TRANSFORMER_CLASS, detect_flux, _DAMAGED_MARKS, FOLDER.family
    )


# --- loading ------------------------------------------------------------------------------------


def load_flux(
    model: ModelSection, flow: FlowSection, weight_dtype: torch.dtype, vae_dtype: torch.dtype
) -> Components:
    """Components of a FLUX.1 dev or schnell model: a diffusers folder or a transformer file.

    Text encoders and tokenizers are (CLIP-L, T5). Every module is frozen, in eval mode, on the
    CPU, in ``weight_dtype`` (the AE in ``vae_dtype``). ModelError for any problem with the files.
    """
    parts = load_flux_parts(FOLDER, model, flow, weight_dtype, vae_dtype)
    return flux_components(parts, flux_family(parts.variant, flow), flow)


def load_flux_parts(
    folder: PipelineFolder,
    model: ModelSection,
    flow: FlowSection,
    weight_dtype: torch.dtype,
    vae_dtype: torch.dtype,
) -> FluxParts:
    """The parts of a FLUX.1-shaped model: a diffusers pipeline folder as ``folder`` declares
    it, or a transformer file with its clip_l, t5xxl and ae files (files.py)."""
    path = Path(model.pretrained_model_name_or_path).expanduser().absolute()
    if not path.is_dir():
        return load_flux_files(path, model, flow, weight_dtype, vae_dtype)
    loaded = load_folder(folder, path, model, flow, weight_dtype, vae_dtype)
    # The modules and tokenizers come in the folder's order, which is FluxParts'.
    return FluxParts(
        *loaded.modules.values(), *loaded.tokenizers.values(), loaded.facts, loaded.model_dir
    )


def flux_components(parts: FluxParts, family, flow: FlowSection) -> Components:
    """Components of loaded FLUX.1-shaped parts trained as ``family`` (which is told the
    transformer's block counts, so the plan shows them)."""
    config = parts.transformer.config
    family = dataclasses.replace(family, blocks=(config.num_layers, config.num_single_layers))
    return Components(
        denoiser=parts.transformer,
        vae=parts.vae,
        text_encoders=(parts.clip_l, parts.t5),
        tokenizers=(parts.clip_tokenizer, parts.t5_tokenizer),
        objective=FlowMatchingObjective(
            FlowOptions.from_section(flow),
            flux_scheduler_config(parts.variant),
            patch=flux_shapes.PATCH_SIZE,
        ),
        family=family,
        model_dir=parts.model_dir,
    )


# --- a diffusers folder -------------------------------------------------------------------------


_ENCODERS = ("text_encoder", "text_encoder_2")


def _variant(folder: CheckedFolder) -> str:
    """The variant of a checked folder, after the transformer's channel check and the text
    encoders' widths against it."""
    config, transformer = folder.config, folder.model_dir / "transformer"
    refuse_channels(transformer, config.get("in_channels", 64))
    variant = "dev" if config.get("guidance_embeds", False) else "schnell"
    check_widths(
        transformer, {**flux_shapes.transformer_config(variant), **config},
        *((folder.part_source(sub), folder.part_config(sub)) for sub in _ENCODERS),
    )  # fmt: skip
    return variant


# A FluxPipeline folder. A [flow] clip_l, t5xxl or ae file replaces the folder's part, and
# t5_tokenizer_path (tokenizer_path) its T5 (CLIP) tokenizer, as for the single files; the parts
# replaced need not be in the folder.
FOLDER = PipelineFolder(
    pipeline=FLUX_PIPELINE,
    family="FLUX.1 (dev or schnell)",
    parts=(
        FolderPart("transformer", "diffusers:FluxTransformer2DModel"),
        FolderPart("vae", "diffusers:AutoencoderKL", "ae", vae=True),
        FolderPart(
            "text_encoder", "transformers:CLIPTextModel", "clip_l", flux_shapes.clip_l_config
        ),
        FolderPart(
            "text_encoder_2", "transformers:T5EncoderModel", "t5xxl", flux_shapes.t5_xxl_config
        ),
    ),
    tokenizers=(
        clip_tokenizer("tokenizer", "clip", 0, "text_encoder", "CLIP-L"),
        t5_tokenizer(
            "tokenizer_2", "text_encoder_2", find_t5_tokenizer_folder, missing_t5_tokenizer
        ),
    ),
    plan_file=plan_flow_file,
    inspect=_variant,
)
