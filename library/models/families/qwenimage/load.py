"""Reading a Qwen-Image model: a diffusers QwenImagePipeline folder through the shared folder
loader (transformer/, vae/, text_encoder/, tokenizer/, scheduler/)."""

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
from library.models.families.qwenimage.detect import detect_qwenimage
from library.models.families.qwenimage.family import qwenimage_family
from library.models.families.qwenimage.objective import (
    QwenImageFlowObjective,
    qwenimage_flow_options,
)
from library.models.loader import Components, read_json

PIPELINE = "QwenImagePipeline"
TRANSFORMER_CLASS = "QwenImageTransformer2DModel"
_DAMAGED_MARKS = re.compile(r'"(model\.diffusion_model\.)?transformer_blocks\.\d+\.(img|txt)_mod\.')


def claims_qwenimage(model: ModelSection, flow: FlowSection) -> bool:
    """True for a QwenImagePipeline folder (or one whose transformer is Qwen-Image's), or a
    .safetensors file of a Qwen-Image transformer (which the loader then refuses by name)."""
    return claims_model(model, PIPELINE, TRANSFORMER_CLASS, detect_qwenimage, _DAMAGED_MARKS)


def load_qwenimage(
    model: ModelSection, flow: FlowSection, weight_dtype: torch.dtype, vae_dtype: torch.dtype
) -> Components:
    """Components of Qwen-Image from a diffusers folder: the transformer, the video VAE,
    Qwen2.5-VL and its tokenizer, frozen, in eval mode, on the CPU, in ``weight_dtype`` (the
    VAE in ``vae_dtype``). ModelError for any problem with the files."""
    path = Path(model.pretrained_model_name_or_path).expanduser().absolute()
    if not path.is_dir():
        raise ModelError(
            f"{path}: Qwen-Image is read from a diffusers QwenImagePipeline folder (transformer/, "
            "vae/, text_encoder/, tokenizer/, scheduler/); single files are not read yet"
        )
    if model.vae:
        raise ModelError(
            f"vae = {model.vae}: Qwen-Image reads the folder's vae/ (AutoencoderKLQwenImage); "
            "remove [model] vae"
        )
    loaded = load_folder(FOLDER, path, model, flow, weight_dtype, vae_dtype)
    modules, (tokenizer,) = loaded.modules, loaded.tokenizers.values()
    return Components(
        denoiser=modules["transformer"],
        vae=modules["vae"],
        text_encoders=(modules["text_encoder"],),
        tokenizers=(tokenizer,),
        objective=QwenImageFlowObjective(qwenimage_flow_options(flow), loaded.facts),
        family=qwenimage_family(),
        model_dir=loaded.model_dir,
    )


def _scheduler(folder: CheckedFolder) -> dict:
    """The folder's sampling scheduler config."""
    return read_json(folder.model_dir / "scheduler" / "scheduler_config.json")


def _tokenizer(folder: CheckedFolder):
    """The folder's Qwen2.5-VL tokenizer, or tokenizer_path's."""
    from transformers import AutoTokenizer

    where = Path(folder.model.tokenizer_path or folder.model_dir / "tokenizer").expanduser()
    try:
        return AutoTokenizer.from_pretrained(str(where), local_files_only=True)
    except (OSError, ValueError) as exc:
        raise ModelError(f"cannot read the Qwen2.5-VL tokenizer in {where}: {exc}") from None


# A QwenImagePipeline folder.
FOLDER = PipelineFolder(
    pipeline=PIPELINE,
    family="Qwen-Image",
    parts=(
        FolderPart("transformer", "diffusers:QwenImageTransformer2DModel"),
        FolderPart("vae", "diffusers:AutoencoderKLQwenImage", vae=True),
        FolderPart("text_encoder", "transformers:Qwen2_5_VLForConditionalGeneration"),
    ),
    tokenizers=(FolderTokenizer("tokenizer", _tokenizer),),
    other={"scheduler": "scheduler_config.json"},
    inspect=_scheduler,
)
