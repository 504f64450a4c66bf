"""Reading a Qwen-Image model: a diffusers QwenImagePipeline folder through the shared folder
loader (transformer/, vae/, text_encoder/, tokenizer/, scheduler/), or the single files ComfyUI
users have (files.py). With a folder, [flow] text_encoder and [model] vae files replace the
folder's parts (which then need not be there).

A transformer file does not say which release it is: [flow] model_version does (musubi-tuner's
--model_version; unset: the text-to-image model), and a folder's model_index.json must agree
with it when it is set."""

from __future__ import annotations

import re
from pathlib import Path

import torch

from library.config.flow_schema import FlowSection
from library.config.schema import ModelSection
from library.errors import ModelError
from library.models.families.claims import claims_model
from library.models.families.folder_loader import (
    CheckedFolder,
    FolderPart,
    FolderTokenizer,
    PipelineFolder,
    load_folder,
)
from library.models.families.local_tokenizer import folder_or_path_tokenizer
from library.models.families.qwenimage import files
from library.models.families.qwenimage.config_keys import check_folder_version
from library.models.families.qwenimage.detect import detect_qwenimage
from library.models.families.qwenimage.family import qwenimage_family
from library.models.families.qwenimage.files import load_qwenimage_files
from library.models.families.qwenimage.objective import (
    QwenImageFlowObjective,
    qwenimage_flow_options,
)
from library.models.families.qwenimage.shapes import scheduler_config
from library.models.loader import Components, read_json

PIPELINE = "QwenImagePipeline"
TRANSFORMER_CLASS = "QwenImageTransformer2DModel"
_DAMAGED_MARKS = re.compile(r'"(model\.diffusion_model\.)?transformer_blocks\.\d+\.(img|txt)_mod\.')


def claims_qwenimage(model: ModelSection, flow: FlowSection) -> bool:
    """True for a QwenImagePipeline folder (or one whose transformer is Qwen-Image's), or a
    .safetensors file of a Qwen-Image transformer (an edit release's, by model_version, is
    claimed by its own family first)."""
    return claims_model(
        model, PIPELINE, TRANSFORMER_CLASS, detect_qwenimage, _DAMAGED_MARKS, FOLDER.family
    )


def load_qwenimage(
    model: ModelSection, flow: FlowSection, weight_dtype: torch.dtype, vae_dtype: torch.dtype
) -> Components:
    """Components of Qwen-Image from a diffusers folder: the transformer, the video VAE,
    Qwen2.5-VL and its tokenizer, frozen, in eval mode, on the CPU, in ``weight_dtype`` (the
    VAE in ``vae_dtype``). ModelError for any problem with the files."""
    path = Path(model.pretrained_model_name_or_path).expanduser().absolute()
    if not path.is_dir():
        if flow.model_version not in (None, "original"):  # an edit release's claim took it
            raise ModelError(f"model_version = {flow.model_version}: not a Qwen-Image file")
        parts = load_qwenimage_files(path, model, flow, weight_dtype, vae_dtype)
        return Components(
            denoiser=parts.transformer,
            vae=parts.vae,
            text_encoders=(parts.text_encoder,),
            tokenizers=(parts.tokenizer,),
            objective=QwenImageFlowObjective(qwenimage_flow_options(flow), scheduler_config()),
            family=qwenimage_family(flow),
            model_dir=parts.model_dir,
        )
    check_folder_version(flow, PIPELINE, path)
    loaded = load_folder(FOLDER, path, model, flow, weight_dtype, vae_dtype)
    modules, (tokenizer,) = loaded.modules, loaded.tokenizers.values()
    return Components(
        denoiser=modules["transformer"],
        vae=modules["vae"],
        text_encoders=(modules["text_encoder"],),
        tokenizers=(tokenizer,),
        objective=QwenImageFlowObjective(qwenimage_flow_options(flow), loaded.facts),
        family=qwenimage_family(flow),
        model_dir=loaded.model_dir,
    )


def plan_file(key: str, value: str):
    """[flow] text_encoder's or [model] vae's file, in place of the folder's part."""
    file = files.component_file(value, key)
    return files.plan_text_encoder(file) if key == "text_encoder" else files.plan_vae(file)


def _scheduler(folder: CheckedFolder) -> dict:
    """The folder's sampling scheduler config."""
    return read_json(folder.model_dir / "scheduler" / "scheduler_config.json")


def _tokenizer(folder: CheckedFolder):
    """The folder's Qwen2.5-VL tokenizer, or tokenizer_path's."""
    return folder_or_path_tokenizer(
        folder.model_dir, folder.model.tokenizer_path, "Qwen2.5-VL", files.TOKENIZER_WHERE
    )


# A QwenImagePipeline folder.
FOLDER = PipelineFolder(
    pipeline=PIPELINE,
    family="Qwen-Image",
    parts=(
        FolderPart("transformer", "diffusers:QwenImageTransformer2DModel"),
        FolderPart("vae", "diffusers:AutoencoderKLQwenImage", "vae", vae=True),
        FolderPart(
            "text_encoder", "transformers:Qwen2_5_VLForConditionalGeneration", "text_encoder"
        ),
    ),
    tokenizers=(FolderTokenizer("tokenizer", _tokenizer),),
    plan_file=plan_file,
    other={"scheduler": "scheduler_config.json"},
    inspect=_scheduler,
)
