"""Loading Chroma: which models are Chroma, and a diffusers ChromaPipeline folder.

The folder (lodestones/Chroma1-HD, Chroma1-Base, or tiny.write_tiny_chroma_folder) holds
transformer/, vae/, text_encoder/ (T5-XXL), tokenizer/ (T5's) and scheduler/; every part and
weights file is checked before anything loads, and nothing is downloaded. The [flow] t5xxl and
ae files replace the folder's text_encoder/ and vae/ (read as for FLUX.1), t5_tokenizer_path its
tokenizer. A single transformer file with its t5xxl and ae files is read by files.py.
"""

from __future__ import annotations

import re
from pathlib import Path

import torch

from library.config.flow_schema import FlowSection
from library.config.schema import ModelSection
from library.models.families.chroma.family import chroma_family
from library.models.families.chroma.files import check_t5_width, load_chroma_files
from library.models.families.chroma.original_keys import detect_chroma
from library.models.families.chroma.shapes import SCHEDULER_CONFIG
from library.models.families.claims import (
    checked_pipeline_folder,
    claims_model,
    part_config,
    part_source,
    without,
)
from library.models.families.file_plans import load_plan
from library.models.families.flux import shapes as flux_shapes
from library.models.families.flux.files import component_plans
from library.models.families.flux.load import freeze
from library.models.families.flux.tokenizers import folder_t5_tokenizer
from library.models.loader import Components, load_weights, offline, read_json
from library.training.objectives import FlowMatchingObjective, FlowOptions

PIPELINE = "ChromaPipeline"
TRANSFORMER_CLASS = "ChromaTransformer2DModel"
# Header text of a damaged Chroma transformer file (diffusers' or the original names).
_DAMAGED_MARKS = re.compile(r'"(model\.diffusion_model\.)?distilled_guidance_layer\.')
_REQUIRED = {"transformer": "config.json", "vae": "config.json", "text_encoder": "config.json"}
_STEMS = {
    "transformer": "diffusion_pytorch_model",
    "vae": "diffusion_pytorch_model",
    "text_encoder": "model",
}
# The folder's part each [flow] component file replaces.
_REPLACES = {"t5xxl": "text_encoder", "ae": "vae"}


def claims_chroma(model: ModelSection, flow: FlowSection) -> bool:
    """True for a ChromaPipeline folder (or one whose transformer is Chroma's), or a
    .safetensors file of a Chroma transformer (damaged ones by their header text)."""
    return claims_model(model, PIPELINE, TRANSFORMER_CLASS, detect_chroma, _DAMAGED_MARKS)


def load_chroma(
    model: ModelSection, flow: FlowSection, weight_dtype: torch.dtype, vae_dtype: torch.dtype
) -> Components:
    """Components of a Chroma diffusers folder or transformer file (files.py): the transformer,
    FLUX.1's AE, T5-XXL and its tokenizer, frozen, in eval mode, on the CPU, in
    ``weight_dtype`` (the AE in ``vae_dtype``). ModelError for any problem with the files."""
    path = Path(model.pretrained_model_name_or_path).expanduser().absolute()
    if path.is_dir():
        transformer, vae, t5, tokenizer, model_dir = _load_folder(
            path, model, flow, weight_dtype, vae_dtype
        )
    else:
        transformer, vae, t5, tokenizer = load_chroma_files(
            path, model, flow, weight_dtype, vae_dtype
        )
        freeze(transformer, vae, t5)
        model_dir = path
    scheduler_file = model_dir / "scheduler" / "scheduler_config.json"
    scheduler = read_json(scheduler_file) if scheduler_file.is_file() else dict(SCHEDULER_CONFIG)
    scheduler = {k: v for k, v in scheduler.items() if not k.startswith("_")}
    return Components(
        denoiser=transformer,
        vae=vae,
        text_encoders=(t5,),
        tokenizers=(tokenizer,),
        objective=FlowMatchingObjective(FlowOptions.from_section(flow), scheduler),
        family=chroma_family(flow),
        model_dir=model_dir,
    )


def _load_folder(
    path: Path, model: ModelSection, flow: FlowSection, weight_dtype: torch.dtype,
    vae_dtype: torch.dtype,
):  # fmt: skip
    from diffusers import AutoencoderKL, ChromaTransformer2DModel
    from transformers import T5EncoderModel

    plans = {k: v for k, v in component_plans(flow).items() if k in _REPLACES}
    skip = {_REPLACES[key] for key in plans}
    model_dir, t5_tokenizer_dir, config = checked_pipeline_folder(
        path, without(_REQUIRED, skip), without(_STEMS, skip), PIPELINE,
        None if flow.t5_tokenizer_path else "tokenizer", "Chroma",
    )  # fmt: skip
    t5_config = part_config(plans, "t5xxl", model_dir / "text_encoder", flux_shapes.t5_xxl_config)
    source = part_source(plans, "t5xxl", model_dir / "text_encoder")
    check_t5_width(model_dir, config, source, t5_config)
    with offline():
        tokenizer = folder_t5_tokenizer(
            model_dir, t5_tokenizer_dir, flow.t5_tokenizer_path, t5_config, "tokenizer"
        )
        transformer = load_weights(
            ChromaTransformer2DModel, model_dir, "transformer", weight_dtype, _STEMS["transformer"]
        )
        vae, t5 = (
            load_plan(plans[key], dtype) if key in plans
            else load_weights(cls, model_dir, _REPLACES[key], dtype, _STEMS[_REPLACES[key]])
            for key, cls, dtype in (
                ("ae", AutoencoderKL, vae_dtype),
                ("t5xxl", T5EncoderModel, weight_dtype),
            )
        )  # fmt: skip
    freeze(transformer, vae, t5)
    return transformer, vae, t5, tokenizer, model_dir
