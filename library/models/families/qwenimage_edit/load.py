"""Reading Qwen-Image-Edit: Qwen-Image's spec (qwenimage/spec.py) as an edit release's, read by
the shared loader. Its parts and files are Qwen-Image's; its folder is a QwenImageEditPipeline
(or QwenImageEditPlusPipeline) one with processor/ too, Qwen2.5-VL's image processor settings
(preprocessor_config.json, or transformers 5's processor_config.json), which processor.py reads
beside the tokenizer. A release's transformer file (Comfy-Org's qwen_image_edit_bf16.safetensors
and the like) is read when [flow] model_version names the release, the processor settings from
tokenizer_path (Qwen/Qwen-Image-Edit's processor/ holds the tokenizer and them); 2511's
transformer gives the reference images' tokens the zero timestep (zero_cond_t), which its folder
config says and its file does not."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import torch

from library.config.flow_section import FlowSection
from library.config.model_schema import ModelSection
from library.errors import ModelError
from library.models.components import Components
from library.models.families.claims import folder_pipeline
from library.models.families.folder_loader import FolderTokenizer
from library.models.families.qwenimage.load import load_release
from library.models.families.qwenimage.spec import SPEC, claims_qwenimage, release_spec
from library.models.families.qwenimage_edit.family import qwenimage_edit_family
from library.models.families.qwenimage_edit.processor import holds_settings, read_processor
from library.models.families.qwenimage_edit.sampling import PIPELINE, PLUS_PIPELINE

(_TOKENIZER,) = SPEC.tokenizers


def _claims(model: ModelSection, flow: FlowSection, pipeline: str, versions) -> bool:
    path = Path(model.pretrained_model_name_or_path).expanduser()
    if path.is_dir():
        return folder_pipeline(path) == pipeline
    return flow.model_version in versions and claims_qwenimage(model, flow)


def claims_qwenimage_edit(model: ModelSection, flow: FlowSection) -> bool:
    """True for a QwenImageEditPipeline folder, or a Qwen-Image transformer file with
    model_version = "edit"."""
    return _claims(model, flow, PIPELINE, ("edit",))


def claims_qwenimage_edit_plus(model: ModelSection, flow: FlowSection) -> bool:
    """True for a QwenImageEditPlusPipeline folder (Qwen-Image-Edit-2509 or 2511), or a
    Qwen-Image transformer file with model_version = "edit-2509" or "edit-2511"."""
    return _claims(model, flow, PLUS_PIPELINE, ("edit-2509", "edit-2511"))


def processor_folder(tokenizer_path: str) -> Path:
    """The folder holding Qwen2.5-VL's image processor settings (processor.SETTINGS_FILES):
    tokenizer_path, or its processor/ (a Qwen-Image-Edit diffusers folder). ModelError naming
    what to set."""
    folder = Path(tokenizer_path).expanduser().absolute()  # the tokenizer's read checked it
    for where in (folder, folder / "processor"):
        if holds_settings(where):
            return where
    raise ModelError(
        f"tokenizer_path {folder} has no preprocessor_config.json (nor processor_config.json) "
        "(Qwen2.5-VL's image processor settings, which an edit model needs to show Qwen2.5-VL "
        "its references): set tokenizer_path to Qwen/Qwen-Image-Edit's processor/ folder, or to "
        "a Qwen-Image-Edit diffusers folder"
    )


# The processor beside the tokenizer: a folder's processor/ (or tokenizer_path's) with it.
PROCESSOR = FolderTokenizer(
    "processor",
    lambda folder: read_processor(folder.model_dir / "processor", _TOKENIZER.read(folder)),
    read_files=lambda files: read_processor(
        processor_folder(files.model.tokenizer_path), _TOKENIZER.read_files(files)
    ),
)
EDIT_SPEC = replace(
    SPEC,
    pipeline=PIPELINE,
    family="Qwen-Image-Edit",
    tokenizers=(_TOKENIZER, PROCESSOR),
    # either of processor.SETTINGS_FILES: the processor's read checks which (before any weight)
    other={**SPEC.other, "processor": None},
)
PLUS_SPEC = replace(EDIT_SPEC, pipeline=PLUS_PIPELINE, family="Qwen-Image-Edit-2509/2511")


def load_qwenimage_edit(
    model: ModelSection, flow: FlowSection, weight_dtype: torch.dtype, vae_dtype: torch.dtype
) -> Components:
    """Components of Qwen-Image-Edit: Qwen-Image's parts, with the tokenizer and the processor
    as its two tokenizers. ModelError for any problem with the files."""
    return _load(EDIT_SPEC, False, model, flow, weight_dtype, vae_dtype)


def load_qwenimage_edit_plus(
    model: ModelSection, flow: FlowSection, weight_dtype: torch.dtype, vae_dtype: torch.dtype
) -> Components:
    """Components of Qwen-Image-Edit-2509/2511, as ``load_qwenimage_edit`` reads
    Qwen-Image-Edit's."""
    return _load(PLUS_SPEC, True, model, flow, weight_dtype, vae_dtype)


def _load(spec, plus: bool, model, flow, weight_dtype, vae_dtype) -> Components:
    # the hook: a release's transformer file takes its zero_cond_t from model_version
    spec = release_spec(spec, zero_cond_t=flow.model_version == "edit-2511")
    family = qwenimage_edit_family(plus=plus, flow=flow)
    return load_release(spec, family, model, flow, weight_dtype, vae_dtype)
