"""Loading Z-Image: which models are Z-Image, and a diffusers ZImagePipeline folder.

The folder (Tongyi-MAI/Z-Image or Z-Image-Turbo, or tiny.write_tiny_zimage_folder) holds
transformer/, vae/, text_encoder/ (Qwen3), tokenizer/ and scheduler/; every part and weights
file is checked before anything loads, and nothing is downloaded. The variant is the
scheduler's: Turbo samples with shift 3.0, Base with 6.0 (the only difference besides the
weights). Single transformer files are recognised (so their error names Z-Image) but not read
yet.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path

import torch

from library.config.flow_schema import FlowSection
from library.config.schema import ModelSection
from library.errors import ModelError
from library.models.families.claims import checked_pipeline_folder, claims_model
from library.models.loader import Components, load_weights, offline, read_json

PIPELINE = "ZImagePipeline"
TRANSFORMER_CLASS = "ZImageTransformer2DModel"
# Block names only Z-Image's transformer has, in the original or diffusers layout.
_MARKS = ("noise_refiner.", "context_refiner.")
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


def detect_zimage(keys: Iterable[str]) -> str | None:
    """ "transformer" when the keys are a Z-Image transformer's (refiner blocks), else None."""
    for key in keys:
        plain = key.removeprefix("model.diffusion_model.")
        if plain.startswith(_MARKS):
            return "transformer"
    return None


def claims_zimage(model: ModelSection, flow: FlowSection) -> bool:
    """True for a ZImagePipeline folder (or one whose transformer is Z-Image's), or a
    .safetensors file of a Z-Image transformer (damaged ones by their header text)."""
    return claims_model(model, PIPELINE, TRANSFORMER_CLASS, detect_zimage, _DAMAGED_MARKS)


def load_zimage(
    model: ModelSection, flow: FlowSection, weight_dtype: torch.dtype, vae_dtype: torch.dtype
) -> Components:
    """Components of a Z-Image diffusers folder: the transformer, FLUX.1's AE, Qwen3 and its
    tokenizer, frozen, in eval mode, on the CPU, in ``weight_dtype`` (the AE in ``vae_dtype``).
    ModelError for any problem with the files."""
    from diffusers import AutoencoderKL, ZImageTransformer2DModel
    from transformers import AutoTokenizer, Qwen3Model

    from library.models.families.zimage.family import variant_of_shift, zimage_family
    from library.models.families.zimage.flow_objective import (
        ZImageFlowObjective,
        zimage_flow_options,
    )

    path = Path(model.pretrained_model_name_or_path).expanduser().absolute()
    if not path.is_dir():
        raise ModelError(
            f"{path}: single Z-Image transformer files are not read yet; point "
            "pretrained_model_name_or_path at a diffusers ZImagePipeline folder"
        )
    model_dir, _, _ = checked_pipeline_folder(
        path, _REQUIRED, _STEMS, PIPELINE, None, "Z-Image (Base or Turbo)"
    )
    scheduler = read_json(model_dir / "scheduler" / "scheduler_config.json")
    if scheduler.get("use_dynamic_shifting"):
        raise ModelError(
            f"{model_dir / 'scheduler'} asks for a resolution-dependent shift; the released "
            "Z-Image schedulers use a static one (shift 3.0 Turbo, 6.0 Base)"
        )
    shift = float(scheduler.get("shift", 1.0))
    tokenizer_dir = Path(model.tokenizer_path) if model.tokenizer_path else model_dir / "tokenizer"
    with offline():
        try:
            tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_dir), local_files_only=True)
        except (OSError, ValueError) as exc:
            raise ModelError(f"cannot read the Qwen3 tokenizer in {tokenizer_dir}: {exc}") from None
        transformer, vae, text_encoder = (
            load_weights(cls, model_dir, sub, dtype, _STEMS[sub])
            for cls, sub, dtype in (
                (ZImageTransformer2DModel, "transformer", weight_dtype),
                (AutoencoderKL, "vae", vae_dtype),
                (Qwen3Model, "text_encoder", weight_dtype),
            )
        )
    for module in (transformer, vae, text_encoder):
        module.requires_grad_(False)
        module.eval()
    return Components(
        denoiser=transformer,
        vae=vae,
        text_encoders=(text_encoder,),
        tokenizers=(tokenizer,),
        objective=ZImageFlowObjective(zimage_flow_options(flow), scheduler),
        family=zimage_family(variant_of_shift(shift), shift),
        model_dir=model_dir,
    )
