"""Reading Qwen-Image-Edit: a diffusers QwenImageEditPipeline folder through the shared folder
loader. Its parts are Qwen-Image's (transformer/, vae/, text_encoder/, tokenizer/, scheduler/)
plus processor/, Qwen2.5-VL's image processor settings (preprocessor_config.json), which
processor.py reads beside the tokenizer."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import torch

from library.config.flow_schema import FlowSection
from library.config.schema import ModelSection
from library.errors import ModelError
from library.models.families.claims import folder_pipeline
from library.models.families.folder_loader import CheckedFolder, FolderTokenizer, load_folder
from library.models.families.qwenimage import load as qwen_load
from library.models.families.qwenimage.objective import (
    QwenImageFlowObjective,
    qwenimage_flow_options,
)
from library.models.families.qwenimage_edit.family import qwenimage_edit_family
from library.models.families.qwenimage_edit.processor import read_processor
from library.models.families.qwenimage_edit.sampling import PIPELINE, PLUS_PIPELINE
from library.models.loader import Components


def claims_qwenimage_edit(model: ModelSection, flow: FlowSection) -> bool:
    """True for a QwenImageEditPipeline folder."""
    path = Path(model.pretrained_model_name_or_path).expanduser()
    return path.is_dir() and folder_pipeline(path) == PIPELINE


def claims_qwenimage_edit_plus(model: ModelSection, flow: FlowSection) -> bool:
    """True for a QwenImageEditPlusPipeline folder (Qwen-Image-Edit-2509 or 2511)."""
    path = Path(model.pretrained_model_name_or_path).expanduser()
    return path.is_dir() and folder_pipeline(path) == PLUS_PIPELINE


def _processor(folder: CheckedFolder):
    """processor/'s image processor with the folder's (or tokenizer_path's) tokenizer."""
    return read_processor(
        folder.model_dir / "processor", qwen_load.FOLDER.tokenizers[0].read(folder)
    )


FOLDER = dataclasses.replace(
    qwen_load.FOLDER,
    pipeline=PIPELINE,
    family="Qwen-Image-Edit",
    tokenizers=(*qwen_load.FOLDER.tokenizers, FolderTokenizer("processor", _processor)),
    other={**qwen_load.FOLDER.other, "processor": "preprocessor_config.json"},
)
PLUS_FOLDER = dataclasses.replace(
    FOLDER, pipeline=PLUS_PIPELINE, family="Qwen-Image-Edit-2509/2511"
)


def load_qwenimage_edit(
    model: ModelSection, flow: FlowSection, weight_dtype: torch.dtype, vae_dtype: torch.dtype
) -> Components:
    """Components of Qwen-Image-Edit from a diffusers folder: Qwen-Image's parts, with the
    tokenizer and the processor as its two tokenizers. ModelError for any problem with the
    files."""
    return _load(FOLDER, model, flow, weight_dtype, vae_dtype)


def load_qwenimage_edit_plus(
    model: ModelSection, flow: FlowSection, weight_dtype: torch.dtype, vae_dtype: torch.dtype
) -> Components:
    """Components of Qwen-Image-Edit-2509/2511 from a diffusers QwenImageEditPlusPipeline
    folder, as ``load_qwenimage_edit`` reads Qwen-Image-Edit's."""
    return _load(PLUS_FOLDER, model, flow, weight_dtype, vae_dtype)


def _load(folder_spec, model, flow, weight_dtype, vae_dtype) -> Components:
    path = Path(model.pretrained_model_name_or_path).expanduser().absolute()
    family = folder_spec.family
    if not path.is_dir():
        raise ModelError(
            f"{path}: {family} is read from a diffusers {folder_spec.pipeline} folder "
            "(transformer/, vae/, text_encoder/, tokenizer/, processor/, scheduler/); single "
            "files are not read yet"
        )
    if model.vae:
        raise ModelError(f"vae = {model.vae}: {family} reads the folder's vae/; remove it")
    loaded = load_folder(folder_spec, path, model, flow, weight_dtype, vae_dtype)
    modules = loaded.modules
    return Components(
        denoiser=modules["transformer"],
        vae=modules["vae"],
        text_encoders=(modules["text_encoder"],),
        tokenizers=tuple(loaded.tokenizers.values()),
        objective=QwenImageFlowObjective(qwenimage_flow_options(flow), loaded.facts),
        family=qwenimage_edit_family(plus=folder_spec is PLUS_FOLDER),
        model_dir=loaded.model_dir,
    )
