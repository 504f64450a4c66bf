"""Loading SD3 / SD3.5 (Medium, 3.5 Medium, 3.5 Large): which models are SD3, and a diffusers
StableDiffusion3Pipeline folder.

The folder is declared as data (FOLDER) for the shared folder loader (folder_loader.py), which
checks every part and weights file before reading them with from_pretrained; the [flow] clip_l,
clip_g and t5xxl files replace its text encoders when set. Stability AI's single
file (the MMDiT, usually the VAE, and maybe the text encoders) with its separate
clip_l, clip_g and t5xxl files is read by library/models/families/sd3/files.py.
"""

from __future__ import annotations

import re
from pathlib import Path

import torch

from library.config.flow_section import FlowSection
from library.config.model_schema import ModelSection
from library.models.families.claims import claims_model
from library.models.families.folder_loader import (
    CheckedFolder,
    FolderPart,
    PipelineFolder,
    clip_tokenizer,
    load_folder,
    t5_tokenizer,
)
from library.models.families.sd3 import shapes as sd3_shapes
from library.models.families.sd3.files import check_widths, load_sd3_files, plan_flow_file
from library.models.families.sd3.original_keys import detect_sd3, variant_for
from library.models.families.sd3.parts import SD3Parts, refuse_channels
from library.models.families.sd3.tokenizers import (
    find_sd3_t5_tokenizer_folder,
    missing_t5_tokenizer,
)

SD3_PIPELINE = "StableDiffusion3Pipeline"
# Key names a damaged SD3 model file's header text shows (Stability's layout).
_DAMAGED_MARKS = re.compile(r'"(model\.diffusion_model\.)?joint_blocks\.\d+\.')
_TRANSFORMER_CLASS = "SD3Transformer2DModel"


# --- which models are SD3 -----------------------------------------------------------------------


def claims_sd3(model: ModelSection, flow: FlowSection) -> bool:
    """True for an SD3 diffusers folder or a .safetensors file holding an SD3 / SD3.5 MMDiT.

    Reads only model_index.json or the file's header. A folder counts when its pipeline class
    is StableDiffusion3Pipeline or its transformer an SD3Transformer2DModel (so the other SD3
    pipelines get load_sd3's refusal rather than the SD loader's "lacks unet/"); a damaged file
    counts when its header text shows SD3's block names (so its error names SD3).
    """
    return claims_model(
        model, SD3_PIPELINE, _TRANSFORMER_CLASS, detect_sd3, _DAMAGED_MARKS, FOLDER.family
    )


# --- loading ------------------------------------------------------------------------------------


def load_sd3_parts(
    model: ModelSection, flow: FlowSection, weight_dtype: torch.dtype, vae_dtype: torch.dtype
) -> SD3Parts:
    """The modules and tokenizers of an SD3 / SD3.5 model (a diffusers folder, or Stability's
    single file with the [flow] clip_l / clip_g / t5xxl files it lacks), with its variant.

    Every module is frozen, in eval mode, on the CPU, in ``weight_dtype`` (the VAE in
    ``vae_dtype``). ModelError for any problem with the files.
    """
    path = Path(model.pretrained_model_name_or_path).expanduser().absolute()
    if not path.is_dir():
        return load_sd3_files(path, model, flow, weight_dtype, vae_dtype)
    loaded = load_folder(FOLDER, path, model, flow, weight_dtype, vae_dtype)
    # The modules and tokenizers come in FOLDER's order, which is SD3Parts'.
    return SD3Parts(
        *loaded.modules.values(), *loaded.tokenizers.values(), loaded.facts, loaded.model_dir
    )


# --- a diffusers folder -------------------------------------------------------------------------

_ENCODERS = ("text_encoder", "text_encoder_2", "text_encoder_3")


def _variant(folder: CheckedFolder) -> str:
    """The variant of a checked folder, after the transformer's channel check and the text
    encoders' widths against it."""
    config, transformer = folder.config, folder.model_dir / "transformer"
    refuse_channels(transformer, config.get("in_channels", 16))
    check_widths(
        transformer, config,
        *((folder.part_source(sub), folder.part_config(sub)) for sub in _ENCODERS),
    )  # fmt: skip
    return variant_for(bool(config.get("qk_norm")), bool(config.get("dual_attention_layers")))


_CLIP = "transformers:CLIPTextModelWithProjection"
# A StableDiffusion3Pipeline folder. A [flow] clip_l, clip_g or t5xxl file replaces the folder's
# text encoder, and t5_tokenizer_path (tokenizer_path) its T5 (CLIP) tokenizers, as for the
# single file; the parts replaced need not be in the folder. [model] vae replaces the folder's
# VAE after loading (load_sd3).
FOLDER = PipelineFolder(
    pipeline=SD3_PIPELINE,
    family="SD3 / SD3.5",
    parts=(
        FolderPart("transformer", "diffusers:SD3Transformer2DModel"),
        FolderPart("vae", "diffusers:AutoencoderKL", vae=True),
        FolderPart("text_encoder", _CLIP, "clip_l", sd3_shapes.clip_l_config),
        FolderPart("text_encoder_2", _CLIP, "clip_g", sd3_shapes.clip_g_config),
        FolderPart(
            "text_encoder_3", "transformers:T5EncoderModel", "t5xxl", sd3_shapes.t5_xxl_config
        ),
    ),
    tokenizers=(
        clip_tokenizer("tokenizer", "clip", 0, "text_encoder", "CLIP-L"),
        clip_tokenizer("tokenizer_2", "openclip", 1, "text_encoder_2", "CLIP-G"),
        t5_tokenizer(
            "tokenizer_3", "text_encoder_3", find_sd3_t5_tokenizer_folder, missing_t5_tokenizer
        ),
    ),
    plan_file=plan_flow_file,
    inspect=_variant,
)
