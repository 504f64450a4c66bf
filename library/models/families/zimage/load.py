"""Loading Z-Image: which models are Z-Image, and a diffusers ZImagePipeline folder.

The folder (Tongyi-MAI/Z-Image or Z-Image-Turbo, or the tests' tiny one) holds
transformer/, vae/, text_encoder/ (Qwen3), tokenizer/ and scheduler/; every part and weights
file is checked before anything loads, and nothing is downloaded. The variant is the
scheduler's: Turbo samples with shift 3.0, Base with 6.0 (the only difference besides the
weights). A single transformer file with its [flow] text_encoder and [model] vae files is read
by files.py; with a folder, those files replace the folder's text_encoder/ and vae/ (a vae that
is a folder or a .ckpt is read by library.models.vae_file).
"""

from __future__ import annotations

import re
from functools import partial
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
    Replacement,
    load_folder,
)
from library.models.families.zimage import files
from library.models.families.zimage.detect import detect_zimage
from library.models.families.zimage.family import variant_of_shift, zimage_family
from library.models.families.zimage.files import load_zimage_files
from library.models.families.zimage.flow_objective import (
    ZImageFlowObjective,
    zimage_flow_options,
)
from library.models.loader import Components, read_json

PIPELINE = "ZImagePipeline"
TRANSFORMER_CLASS = "ZImageTransformer2DModel"
_DAMAGED_MARKS = re.compile(r'"(model\.diffusion_model\.)?(noise|context)_refiner\.\d+\.')


def claims_zimage(model: ModelSection, flow: FlowSection) -> bool:
    """True for a ZImagePipeline folder (or one whose transformer is Z-Image's), or a
    .safetensors file of a Z-Image transformer (damaged ones by their header text)."""
    return claims_model(
        model, PIPELINE, TRANSFORMER_CLASS, detect_zimage, _DAMAGED_MARKS, FOLDER.family
    )


def load_zimage(
    model: ModelSection, flow: FlowSection, weight_dtype: torch.dtype, vae_dtype: torch.dtype
) -> Components:
    """Components of Z-Image as a diffusers folder or single files (files.py): the transformer,
    FLUX.1's AE, Qwen3 and its tokenizer, frozen, in eval mode, on the CPU, in ``weight_dtype``
    (the AE in ``vae_dtype``). ModelError for any problem with the files."""

    path = Path(model.pretrained_model_name_or_path).expanduser().absolute()
    if path.is_dir():
        loaded = load_folder(FOLDER, path, model, flow, weight_dtype, vae_dtype)
        # The modules come in FOLDER's order, which is ZImageFiles'.
        parts = files.ZImageFiles(
            *loaded.modules.values(), *loaded.tokenizers.values(), loaded.facts, loaded.model_dir
        )
    else:
        parts = load_zimage_files(path, model, flow, weight_dtype, vae_dtype)
    shift = float(parts.scheduler.get("shift", 1.0))
    return Components(
        denoiser=parts.transformer,
        vae=parts.vae,
        text_encoders=(parts.text_encoder,),
        tokenizers=(parts.tokenizer,),
        objective=ZImageFlowObjective(zimage_flow_options(flow), parts.scheduler),
        family=zimage_family(variant_of_shift(shift), shift),
        model_dir=parts.model_dir,
    )


def _scheduler(folder: CheckedFolder) -> dict:
    """The folder's sampling scheduler config; ModelError for a resolution-dependent shift."""
    scheduler = read_json(folder.model_dir / "scheduler" / "scheduler_config.json")
    if scheduler.get("use_dynamic_shifting"):
        raise ModelError(
            f"{folder.model_dir / 'scheduler'} asks for a resolution-dependent shift; the "
            "released Z-Image schedulers use a static one (shift 3.0 Turbo, 6.0 Base)"
        )
    return scheduler


def _tokenizer(folder: CheckedFolder):
    """The folder's Qwen3 tokenizer, or tokenizer_path's."""
    from transformers import AutoTokenizer

    if folder.model.tokenizer_path:
        plan = folder.plans.get("text_encoder")
        config = plan.config if plan is not None else None
        return files.load_qwen3_tokenizer(folder.model.tokenizer_path, config, folder.model_dir)
    tokenizer_dir = folder.model_dir / "tokenizer"
    try:
        return AutoTokenizer.from_pretrained(str(tokenizer_dir), local_files_only=True)
    except (OSError, ValueError) as exc:
        raise ModelError(f"cannot read the Qwen3 tokenizer in {tokenizer_dir}: {exc}") from None


def _plan_file(key: str, value: str) -> Replacement:
    """[flow] text_encoder's file, or [model] vae: a .safetensors file is planned as FLUX.1's
    AE, a diffusers VAE folder or a .ckpt read by library.models.vae_file."""
    if key == "text_encoder":
        return files.plan_text_encoder(files.component_file(value, key))
    path = Path(value).expanduser().absolute()
    if path.suffix.lower() == ".safetensors":
        return files.plan_ae(files.component_file(value, key))
    return partial(files.load_vae_option, path)


# A ZImagePipeline folder; a [flow] text_encoder or [model] vae replaces the folder's part (which
# then need not be there), tokenizer_path its tokenizer.
FOLDER = PipelineFolder(
    pipeline=PIPELINE,
    family="Z-Image (Base or Turbo)",
    parts=(
        FolderPart("transformer", "diffusers:ZImageTransformer2DModel"),
        FolderPart("vae", "diffusers:AutoencoderKL", "vae", vae=True),
        FolderPart("text_encoder", "transformers:Qwen3Model", "text_encoder"),
    ),
    tokenizers=(FolderTokenizer("tokenizer", _tokenizer),),
    plan_file=_plan_file,
    other={"scheduler": "scheduler_config.json"},
    inspect=_scheduler,
)
