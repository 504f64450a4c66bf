"""Loading SD3 / SD3.5 (Medium, 3.5 Medium, 3.5 Large): which models are SD3, and a diffusers
StableDiffusion3Pipeline folder.

The folder is read with from_pretrained after every part and weights file is checked; the
[flow] clip_l, clip_g and t5xxl files replace its text encoders when set. Stability AI's single
file (the MMDiT, usually the VAE, and maybe the text encoders) with its separate
clip_l, clip_g and t5xxl files is read by library/models/families/sd3/files.py.
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
from library.models.families.flux.tokenizers import folder_t5_tokenizer
from library.models.families.sd3 import shapes as sd3_shapes
from library.models.families.sd3.files import check_widths, component_plans, load_sd3_files
from library.models.families.sd3.original_keys import detect_sd3, variant_for
from library.models.families.sd3.parts import SD3Parts, refuse_channels
from library.models.families.sd3.tokenizers import (
    find_sd3_t5_tokenizer_folder,
    missing_t5_tokenizer,
)
from library.models.loader import load_weights, offline
from library.models.tokenizers import folder_tokenizer

SD3_PIPELINE = "StableDiffusion3Pipeline"
# Key names a damaged SD3 model file's header text shows (Stability's layout).
_DAMAGED_MARKS = re.compile(r'"(model\.diffusion_model\.)?joint_blocks\.\d+\.')
_TRANSFORMER_CLASS = "SD3Transformer2DModel"
# Subfolder -> the file that must be in it (None: a CLIP tokenizer folder). tokenizer_3 (T5) is
# checked on its own: the CLIP tokenizer check would ask a T5 folder for vocab.json + merges.txt.
_REQUIRED = {
    "transformer": "config.json",
    "vae": "config.json",
    "text_encoder": "config.json",
    "text_encoder_2": "config.json",
    "text_encoder_3": "config.json",
    "tokenizer": None,
    "tokenizer_2": None,
}
# The folder's part each [flow] component file replaces.
_REPLACES = {"clip_l": "text_encoder", "clip_g": "text_encoder_2", "t5xxl": "text_encoder_3"}
# Weights file stem per subfolder (loader.find_weights' names).
_STEMS = {
    "transformer": "diffusion_pytorch_model",
    "vae": "diffusion_pytorch_model",
    "text_encoder": "model",
    "text_encoder_2": "model",
    "text_encoder_3": "model",
}


# --- which models are SD3 -----------------------------------------------------------------------


def claims_sd3(model: ModelSection, flow: FlowSection) -> bool:
    """True for an SD3 diffusers folder or a .safetensors file holding an SD3 / SD3.5 MMDiT.

    Reads only model_index.json or the file's header. A folder counts when its pipeline class
    is StableDiffusion3Pipeline or its transformer an SD3Transformer2DModel (so the other SD3
    pipelines get load_sd3's refusal rather than the SD loader's "lacks unet/"); a damaged file
    counts when its header text shows SD3's block names (so its error names SD3).
    """
    return claims_model(model, SD3_PIPELINE, _TRANSFORMER_CLASS, detect_sd3, _DAMAGED_MARKS)


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
    if path.is_dir():
        return _load_folder(path, model, flow, weight_dtype, vae_dtype)
    return load_sd3_files(path, model, flow, weight_dtype, vae_dtype)


def freeze(*modules: torch.nn.Module) -> None:
    for module in modules:
        module.requires_grad_(False)
        module.eval()


# --- a diffusers folder -------------------------------------------------------------------------


def _load_folder(
    path: Path, model: ModelSection, flow: FlowSection, weight_dtype: torch.dtype,
    vae_dtype: torch.dtype,
) -> SD3Parts:  # fmt: skip
    """A StableDiffusion3Pipeline folder. A [flow] clip_l, clip_g or t5xxl file replaces the
    folder's text encoder, and t5_tokenizer_path (tokenizer_path) its T5 (CLIP) tokenizers, as
    for the single file; the parts replaced need not be in the folder."""
    from diffusers import AutoencoderKL, SD3Transformer2DModel
    from transformers import CLIPTextModelWithProjection, T5EncoderModel

    plans = component_plans(flow)  # the [flow] files set, each header read and checked
    skip = {_REPLACES[key] for key in plans}
    if model.tokenizer_path:
        skip |= {"tokenizer", "tokenizer_2"}
    model_dir, t5_tokenizer_dir, config = checked_pipeline_folder(
        path, without(_REQUIRED, skip), without(_STEMS, skip), SD3_PIPELINE,
        None if flow.t5_tokenizer_path else "tokenizer_3", "SD3 / SD3.5",
    )  # fmt: skip
    refuse_channels(model_dir / "transformer", config.get("in_channels", 16))
    variant = variant_for(bool(config.get("qk_norm")), bool(config.get("dual_attention_layers")))
    bases = {
        "clip_l": sd3_shapes.clip_l_config,
        "clip_g": sd3_shapes.clip_g_config,
        "t5xxl": sd3_shapes.t5_xxl_config,
    }
    configs = {
        key: part_config(plans, key, model_dir / _REPLACES[key], base)
        for key, base in bases.items()
    }
    check_widths(
        model_dir / "transformer", config,
        *((part_source(plans, k, model_dir / _REPLACES[k]), configs[k]) for k in bases),
    )  # fmt: skip
    with offline():
        # Tokenizers first: a broken one fails in a second, not after the weights.
        tokenizers = [
            folder_tokenizer(
                model_dir, sub, kind, index, model.tokenizer_path, configs[key], name
            )
            for index, (sub, kind, key, name) in enumerate(
                (("tokenizer", "clip", "clip_l", "CLIP-L"),
                 ("tokenizer_2", "openclip", "clip_g", "CLIP-G"))
            )
        ]  # fmt: skip
        t5_tokenizer = folder_t5_tokenizer(
            model_dir, t5_tokenizer_dir, flow.t5_tokenizer_path, configs["t5xxl"], "tokenizer_3",
            find_sd3_t5_tokenizer_folder, missing_t5_tokenizer,
        )  # fmt: skip
        transformer, vae = (
            load_weights(cls, model_dir, sub, dtype, _STEMS[sub])
            for cls, sub, dtype in (
                (SD3Transformer2DModel, "transformer", weight_dtype),
                (AutoencoderKL, "vae", vae_dtype),
            )
        )
        clip_l, clip_g, t5 = (
            load_plan(plans[key], weight_dtype) if key in plans
            else load_weights(cls, model_dir, _REPLACES[key], weight_dtype, "model")
            for key, cls in (
                ("clip_l", CLIPTextModelWithProjection),
                ("clip_g", CLIPTextModelWithProjection),
                ("t5xxl", T5EncoderModel),
            )
        )  # fmt: skip
    freeze(transformer, vae, clip_l, clip_g, t5)
    return SD3Parts(
        transformer, vae, clip_l, clip_g, t5, *tokenizers, t5_tokenizer, variant, model_dir
    )
