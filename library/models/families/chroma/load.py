"""Loading Chroma: which models are Chroma, and a diffusers ChromaPipeline folder.

The folder (lodestones/Chroma1-HD, Chroma1-Base, or the tests' tiny one) holds
transformer/, vae/, text_encoder/ (T5-XXL), tokenizer/ (T5's) and scheduler/; it is declared as
data for the shared folder loader (library.models.families.folder_loader), which checks every
part and weights file before anything loads; nothing is downloaded. The [flow] t5xxl and ae
files replace the folder's text_encoder/ and vae/ (read as for FLUX.1), t5_tokenizer_path its
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
from library.models.families.chroma.shapes import PATCH_SIZE, SCHEDULER_CONFIG
from library.models.families.claims import claims_model
from library.models.families.flux import shapes as flux_shapes
from library.models.families.flux.files import plan_flow_file
from library.models.families.flux.tokenizers import find_t5_tokenizer_folder, missing_t5_tokenizer
from library.models.families.folder_loader import (
    CheckedFolder,
    FolderPart,
    PipelineFolder,
    load_folder,
    t5_tokenizer,
)
from library.models.loader import Components, read_json
from library.training.objectives import FlowMatchingObjective, FlowOptions

PIPELINE = "ChromaPipeline"
TRANSFORMER_CLASS = "ChromaTransformer2DModel"
# Header text of a damaged Chroma transformer file (diffusers' or the original names).
_DAMAGED_MARKS = re.compile(r'"(model\.diffusion_model\.)?distilled_guidance_layer\.')


def claims_chroma(model: ModelSection, flow: FlowSection) -> bool:
    """True for a ChromaPipeline folder (or one whose transformer is Chroma's), or a
    .safetensors file of a Chroma transformer (damaged ones by their header text)."""
    return claims_model(
        model, PIPELINE, TRANSFORMER_CLASS, detect_chroma, _DAMAGED_MARKS, FOLDER.family
    )


def load_chroma(
    model: ModelSection, flow: FlowSection, weight_dtype: torch.dtype, vae_dtype: torch.dtype
) -> Components:
    """Components of a Chroma diffusers folder or transformer file (files.py): the transformer,
    FLUX.1's AE, T5-XXL and its tokenizer, frozen, in eval mode, on the CPU, in
    ``weight_dtype`` (the AE in ``vae_dtype``). ModelError for any problem with the files."""
    path = Path(model.pretrained_model_name_or_path).expanduser().absolute()
    if path.is_dir():
        loaded = load_folder(FOLDER, path, model, flow, weight_dtype, vae_dtype)
        transformer, vae, t5 = loaded.modules.values()
        (tokenizer,) = loaded.tokenizers.values()
        model_dir = loaded.model_dir
    else:
        transformer, vae, t5, tokenizer = load_chroma_files(
            path, model, flow, weight_dtype, vae_dtype
        )
        model_dir = path
    scheduler_file = model_dir / "scheduler" / "scheduler_config.json"
    scheduler = read_json(scheduler_file) if scheduler_file.is_file() else dict(SCHEDULER_CONFIG)
    scheduler = {k: v for k, v in scheduler.items() if not k.startswith("_")}
    return Components(
        denoiser=transformer,
        vae=vae,
        text_encoders=(t5,),
        tokenizers=(tokenizer,),
        objective=FlowMatchingObjective(
            FlowOptions.from_section(flow), scheduler, patch=PATCH_SIZE
        ),
        family=chroma_family(flow),
        model_dir=model_dir,
    )


def _inspect(folder: CheckedFolder) -> None:
    """T5's states fit the transformer's text input."""
    source = folder.part_source("text_encoder")
    check_t5_width(folder.model_dir, folder.config, source, folder.part_config("text_encoder"))


# A ChromaPipeline folder; a [flow] t5xxl or ae file replaces the folder's part, and
# t5_tokenizer_path its tokenizer (the parts replaced need not be in the folder).
FOLDER = PipelineFolder(
    pipeline=PIPELINE,
    family="Chroma",
    parts=(
        FolderPart("transformer", f"diffusers:{TRANSFORMER_CLASS}"),
        FolderPart("vae", "diffusers:AutoencoderKL", "ae", vae=True),
        FolderPart(
            "text_encoder", "transformers:T5EncoderModel", "t5xxl", flux_shapes.t5_xxl_config
        ),
    ),
    tokenizers=(
        t5_tokenizer("tokenizer", "text_encoder", find_t5_tokenizer_folder, missing_t5_tokenizer),
    ),
    plan_file=plan_flow_file,
    inspect=_inspect,
)
