"""Reading Qwen-Image-Edit: a diffusers QwenImageEditPipeline folder through the shared folder
loader. Its parts are Qwen-Image's (transformer/, vae/, text_encoder/, tokenizer/, scheduler/)
plus processor/, Qwen2.5-VL's image processor settings (preprocessor_config.json, or
transformers 5's processor_config.json), which processor.py reads beside the tokenizer. A release's transformer file (Comfy-Org's
qwen_image_edit_bf16.safetensors and the like) is read with Qwen-Image's component files
(qwenimage/files.py) when [flow] model_version names the release, the processor settings from
tokenizer_path (Qwen/Qwen-Image-Edit's processor/ holds the tokenizer and them)."""

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
from library.models.families.qwenimage.config_keys import check_folder_version
from library.models.families.qwenimage.files import load_qwenimage_files
from library.models.families.qwenimage.objective import (
    QwenImageFlowObjective,
    qwenimage_flow_options,
)
from library.models.families.qwenimage.shapes import scheduler_config
from library.models.families.qwenimage_edit.family import qwenimage_edit_family
from library.models.families.qwenimage_edit.processor import holds_settings, read_processor
from library.models.families.qwenimage_edit.sampling import PIPELINE, PLUS_PIPELINE
from library.models.loader import Components


def _claims(model: ModelSection, flow: FlowSection, pipeline: str, versions) -> bool:
    path = Path(model.pretrained_model_name_or_path).expanduser()
    if path.is_dir():
        return folder_pipeline(path) == pipeline
    return flow.model_version in versions and qwen_load.claims_qwenimage(model, flow)


def claims_qwenimage_edit(model: ModelSection, flow: FlowSection) -> bool:
    """True for a QwenImageEditPipeline folder, or a Qwen-Image transformer file with
    model_version = "edit"."""
    return _claims(model, flow, PIPELINE, ("edit",))


def claims_qwenimage_edit_plus(model: ModelSection, flow: FlowSection) -> bool:
    """True for a QwenImageEditPlusPipeline folder (Qwen-Image-Edit-2509 or 2511), or a
    Qwen-Image transformer file with model_version = "edit-2509" or "edit-2511"."""
    return _claims(model, flow, PLUS_PIPELINE, ("edit-2509", "edit-2511"))


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
    # either of processor.SETTINGS_FILES: _processor checks which (before any weight is read)
    other={**qwen_load.FOLDER.other, "processor": None},
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
    plus = folder_spec is PLUS_FOLDER
    if not path.is_dir():
        return _load_files(path, model, flow, weight_dtype, vae_dtype, plus)
    check_folder_version(flow, folder_spec.pipeline, path)
    loaded = load_folder(folder_spec, path, model, flow, weight_dtype, vae_dtype)
    modules = loaded.modules
    return Components(
        denoiser=modules["transformer"],
        vae=modules["vae"],
        text_encoders=(modules["text_encoder"],),
        tokenizers=tuple(loaded.tokenizers.values()),
        objective=QwenImageFlowObjective(qwenimage_flow_options(flow), loaded.facts),
        family=qwenimage_edit_family(plus=plus, flow=flow),
        model_dir=loaded.model_dir,
    )


def _load_files(path: Path, model, flow, weight_dtype, vae_dtype, plus: bool) -> Components:
    """The release's transformer file with Qwen-Image's component files; 2511's transformer
    gives the reference images' tokens the zero timestep (zero_cond_t), as its folder's config
    says."""
    parts = load_qwenimage_files(
        path, model, flow, weight_dtype, vae_dtype, zero_cond_t=flow.model_version == "edit-2511"
    )
    processor = read_processor(processor_folder(model.tokenizer_path), parts.tokenizer)
    return Components(
        denoiser=parts.transformer,
        vae=parts.vae,
        text_encoders=(parts.text_encoder,),
        tokenizers=(parts.tokenizer, processor),
        objective=QwenImageFlowObjective(qwenimage_flow_options(flow), scheduler_config()),
        family=qwenimage_edit_family(plus=plus, flow=flow),
        model_dir=parts.model_dir,
    )


def processor_folder(tokenizer_path: str) -> Path:
    """The folder holding Qwen2.5-VL's image processor settings (processor.SETTINGS_FILES):
    tokenizer_path, or its processor/ (a Qwen-Image-Edit diffusers folder). ModelError naming
    what to set."""
    folder = Path(tokenizer_path).expanduser().absolute()  # load_qwenimage_files checked it
    for where in (folder, folder / "processor"):
        if holds_settings(where):
            return where
    raise ModelError(
        f"tokenizer_path {folder} has no preprocessor_config.json (nor processor_config.json) "
        "(Qwen2.5-VL's image "
        "processor settings, which an edit model needs to show Qwen2.5-VL its references): set "
        "tokenizer_path to Qwen/Qwen-Image-Edit's processor/ folder, or to a Qwen-Image-Edit "
        "diffusers folder"
    )
