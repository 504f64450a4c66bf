"""Loading Z-Image: which models are Z-Image, and a diffusers ZImagePipeline folder.

The folder (Tongyi-MAI/Z-Image or Z-Image-Turbo, or tiny.write_tiny_zimage_folder) holds
transformer/, vae/, text_encoder/ (Qwen3), tokenizer/ and scheduler/; every part and weights
file is checked before anything loads, and nothing is downloaded. The variant is the
scheduler's: Turbo samples with shift 3.0, Base with 6.0 (the only difference besides the
weights). A single transformer file with its [flow] text_encoder and [model] vae files is read
by files.py; with a folder, those files replace the folder's text_encoder/ and vae/ (a vae that
is a folder or a .ckpt is read by library.models.vae_file).
"""

from __future__ import annotations

import re
from pathlib import Path

import torch

from library.config.flow_schema import FlowSection
from library.config.schema import ModelSection
from library.errors import ModelError
from library.models.families.claims import checked_pipeline_folder, claims_model, without
from library.models.families.file_plans import load_plan
from library.models.families.zimage import files
from library.models.families.zimage.detect import detect_zimage
from library.models.families.zimage.family import variant_of_shift, zimage_family
from library.models.families.zimage.files import load_zimage_files
from library.models.families.zimage.flow_objective import (
    ZImageFlowObjective,
    zimage_flow_options,
)
from library.models.loader import Components, load_weights, offline, read_json

PIPELINE = "ZImagePipeline"
TRANSFORMER_CLASS = "ZImageTransformer2DModel"
_DAMAGED_MARKS = re.compile(r'"(model\.diffusion_model\.)?(noise|context)_refiner\.\d+\.')
_REQUIRED = {
    "transformer": "config.json",
    "vae": "config.json",
    "text_encoder": "config.json",
    "scheduler": "scheduler_config.json",
    "tokenizer": None,
}
_STEMS = {
    "transformer": "diffusion_pytorch_model",
    "vae": "diffusion_pytorch_model",
    "text_encoder": "model",
}


def claims_zimage(model: ModelSection, flow: FlowSection) -> bool:
    """True for a ZImagePipeline folder (or one whose transformer is Z-Image's), or a
    .safetensors file of a Z-Image transformer (damaged ones by their header text)."""
    return claims_model(model, PIPELINE, TRANSFORMER_CLASS, detect_zimage, _DAMAGED_MARKS)


def load_zimage(
    model: ModelSection, flow: FlowSection, weight_dtype: torch.dtype, vae_dtype: torch.dtype
) -> Components:
    """Components of Z-Image as a diffusers folder or single files (files.py): the transformer,
    FLUX.1's AE, Qwen3 and its tokenizer, frozen, in eval mode, on the CPU, in ``weight_dtype``
    (the AE in ``vae_dtype``). ModelError for any problem with the files."""

    path = Path(model.pretrained_model_name_or_path).expanduser().absolute()
    if path.is_dir():
        parts = _load_folder(path, model, flow, weight_dtype, vae_dtype)
    else:
        parts = load_zimage_files(path, model, flow, weight_dtype, vae_dtype)
    for module in (parts.transformer, parts.vae, parts.text_encoder):
        module.requires_grad_(False)
        module.eval()
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


def _load_folder(
    path: Path, model: ModelSection, flow: FlowSection, weight_dtype: torch.dtype,
    vae_dtype: torch.dtype,
):  # fmt: skip
    """A ZImagePipeline folder; a [flow] text_encoder or [model] vae replaces the folder's part
    (which then need not be there), tokenizer_path its tokenizer."""
    from diffusers import AutoencoderKL, ZImageTransformer2DModel
    from transformers import AutoTokenizer, Qwen3Model

    plans = {}
    if flow.text_encoder:
        plans["text_encoder"] = files.plan_text_encoder(
            files.component_file(flow.text_encoder, "text_encoder")
        )
    vae_path = Path(model.vae).expanduser().absolute() if model.vae else None
    if vae_path is not None and vae_path.suffix.lower() == ".safetensors":
        plans["vae"] = files.plan_ae(files.component_file(model.vae, "vae"))
    skip = set(plans) | ({"vae"} if vae_path else set())
    skip |= {"tokenizer"} if model.tokenizer_path else set()
    model_dir, _, _ = checked_pipeline_folder(
        path, without(_REQUIRED, skip), without(_STEMS, skip), PIPELINE, None,
        "Z-Image (Base or Turbo)",
    )  # fmt: skip
    scheduler = read_json(model_dir / "scheduler" / "scheduler_config.json")
    if scheduler.get("use_dynamic_shifting"):
        raise ModelError(
            f"{model_dir / 'scheduler'} asks for a resolution-dependent shift; the released "
            "Z-Image schedulers use a static one (shift 3.0 Turbo, 6.0 Base)"
        )
    with offline():
        if model.tokenizer_path:
            config = plans["text_encoder"].config if "text_encoder" in plans else None
            tokenizer = files.load_qwen3_tokenizer(model.tokenizer_path, config, model_dir)
        else:
            tokenizer_dir = model_dir / "tokenizer"
            try:
                tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_dir), local_files_only=True)
            except (OSError, ValueError) as exc:
                raise ModelError(
                    f"cannot read the Qwen3 tokenizer in {tokenizer_dir}: {exc}"
                ) from None
        transformer = load_weights(
            ZImageTransformer2DModel, model_dir, "transformer", weight_dtype, _STEMS["transformer"]
        )
        text_encoder = (
            load_plan(plans["text_encoder"], weight_dtype) if "text_encoder" in plans
            else load_weights(Qwen3Model, model_dir, "text_encoder", weight_dtype, "model")
        )  # fmt: skip
        if "vae" in plans:
            vae = load_plan(plans["vae"], vae_dtype)
        elif vae_path is not None:  # a diffusers VAE folder or a .ckpt
            vae = files.load_vae_option(vae_path, vae_dtype)
        else:
            vae = load_weights(AutoencoderKL, model_dir, "vae", vae_dtype, _STEMS["vae"])
    return files.ZImageFiles(transformer, vae, text_encoder, tokenizer, scheduler, model_dir)
