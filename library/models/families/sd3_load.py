"""Loading SD3 / SD3.5 (Medium, 3.5 Medium, 3.5 Large): which models are SD3, and a diffusers
StableDiffusion3Pipeline folder.

The folder is read with from_pretrained after every part and weights file is checked. Stability
AI's single file (the MMDiT, usually the VAE, and maybe the text encoders) with its separate
clip_l, clip_g and t5xxl files is read by library/models/families/sd3_files.py.
"""

from __future__ import annotations

from pathlib import Path

import torch

from library.config.flow_schema import FlowSection
from library.config.schema import ModelSection
from library.errors import ModelError
from library.models.families.claims import checked_pipeline_folder, claims_model
from library.models.families.flux_tokenizers import (
    check_vocab,
    load_t5_tokenizer,
)
from library.models.families.sd3_parts import SD3Parts
from library.models.loader import (
    load_clip_tokenizer,
    load_weights,
    offline,
    read_json,
)
from library.models.sd3 import shapes as sd3_shapes
from library.models.sd3.original_keys import detect_sd3, variant_for

SD3_PIPELINE = "StableDiffusion3Pipeline"
_TRANSFORMER_CLASS = "SD3Transformer2DModel"
# Subfolder -> the file that must be in it (None: a CLIP tokenizer folder). tokenizer_3 (T5) is
# checked on its own: the CLIP tokenizer check would ask a T5 folder for vocab.json + merges.txt.
_REQUIRED = {
    "transformer": "config.json",
    "vae": "config.json",
    "text_encoder": "config.json",
    "text_encoder_2": "config.json",
    "text_encoder_3": "config.json",
    "tokenizer": None,
    "tokenizer_2": None,
}
# Weights file stem per subfolder (loader.find_weights' names).
_STEMS = {
    "transformer": "diffusion_pytorch_model",
    "vae": "diffusion_pytorch_model",
    "text_encoder": "model",
    "text_encoder_2": "model",
    "text_encoder_3": "model",
}


# --- which models are SD3 -----------------------------------------------------------------------


def claims_sd3(model: ModelSection, flow: FlowSection) -> bool:
    """True for an SD3 diffusers folder or a .safetensors file holding an SD3 / SD3.5 MMDiT.

    Reads only model_index.json or the file's header. A folder counts when its pipeline class
    is StableDiffusion3Pipeline or its transformer an SD3Transformer2DModel (so the other SD3
    pipelines get load_sd3's refusal rather than the SD loader's "lacks unet/").
    """
    return claims_model(model, SD3_PIPELINE, _TRANSFORMER_CLASS, detect_sd3)


# --- loading ------------------------------------------------------------------------------------


def load_sd3_parts(
    model: ModelSection, flow: FlowSection, weight_dtype: torch.dtype, vae_dtype: torch.dtype
) -> SD3Parts:
    """The modules and tokenizers of an SD3 / SD3.5 model (a diffusers folder, or Stability's
    single file with the [flow] clip_l / clip_g / t5xxl files it lacks), with its variant.

    Every module is frozen, in eval mode, on the CPU, in ``weight_dtype`` (the VAE in
    ``vae_dtype``). ModelError for any problem with the files.
    """
    path = Path(model.pretrained_model_name_or_path).expanduser().absolute()
    if path.is_dir():
        return _load_folder(path, weight_dtype, vae_dtype)
    from library.models.families.sd3_files import load_sd3_files

    return load_sd3_files(path, model, flow, weight_dtype, vae_dtype)


def freeze(*modules: torch.nn.Module) -> None:
    for module in modules:
        module.requires_grad_(False)
        module.eval()


def refuse_channels(where: Path, channels: int) -> None:
    expected = sd3_shapes.LATENT_CHANNELS
    if channels != expected:
        raise ModelError(
            f"{where} takes {channels} input channels (an inpainting or control model?); only "
            f"text-to-image SD3 / SD3.5 models with {expected} (the VAE's latents) can be trained"
        )


# --- a diffusers folder -------------------------------------------------------------------------


def _load_folder(path: Path, weight_dtype: torch.dtype, vae_dtype: torch.dtype) -> SD3Parts:
    from diffusers import AutoencoderKL, SD3Transformer2DModel
    from transformers import CLIPTextModelWithProjection, T5EncoderModel

    model_dir, t5_tokenizer_dir, config = checked_pipeline_folder(
        path, _REQUIRED, _STEMS, SD3_PIPELINE, "tokenizer_3", "SD3 / SD3.5"
    )
    refuse_channels(model_dir / "transformer", config.get("in_channels", 16))
    variant = variant_for(bool(config.get("qk_norm")), bool(config.get("dual_attention_layers")))
    clip_configs = {
        sub: {**base, **read_json(model_dir / sub / "config.json")}
        for sub, base in (
            ("text_encoder", sd3_shapes.clip_l_config()),
            ("text_encoder_2", sd3_shapes.clip_g_config()),
        )
    }
    t5_config = {
        **sd3_shapes.t5_xxl_config(),
        **read_json(model_dir / "text_encoder_3" / "config.json"),
    }
    with offline():
        # Tokenizers first: a broken one fails in a second, not after the weights.
        tokenizers = []
        for sub, folder, name in (
            ("text_encoder", "tokenizer", "CLIP-L"),
            ("text_encoder_2", "tokenizer_2", "CLIP-G"),
        ):
            config = clip_configs[sub]
            tokenizer = load_clip_tokenizer(model_dir / folder, config["max_position_embeddings"])
            check_vocab(model_dir / folder, tokenizer, config["vocab_size"], name)
            tokenizers.append(tokenizer)
        t5_tokenizer = load_t5_tokenizer(t5_tokenizer_dir, t5_config["vocab_size"])
        transformer, vae, clip_l, clip_g, t5 = (
            load_weights(cls, model_dir, sub, dtype, _STEMS[sub])
            for cls, sub, dtype in (
                (SD3Transformer2DModel, "transformer", weight_dtype),
                (AutoencoderKL, "vae", vae_dtype),
                (CLIPTextModelWithProjection, "text_encoder", weight_dtype),
                (CLIPTextModelWithProjection, "text_encoder_2", weight_dtype),
                (T5EncoderModel, "text_encoder_3", weight_dtype),
            )
        )
    freeze(transformer, vae, clip_l, clip_g, t5)
    return SD3Parts(
        transformer, vae, clip_l, clip_g, t5, *tokenizers, t5_tokenizer, variant, model_dir
    )
