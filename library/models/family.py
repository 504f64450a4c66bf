"""Model families as data: what differs between SD 1.x, SD 2.x, SD 2.x 768-v and SDXL.

The trainer never branches on a family name; it reads these fields (prediction target, which
text encoders exist and which of their layers condition the UNet, pooled/size conditioning, LoRA
key prefixes and UNet key layout, metadata strings). SDXL is one more instance with two entries
in the text-encoder tuples and its pooled/size conditioning switched on.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from library.config.schema import ModelSection

log = logging.getLogger(__name__)

PredictionType = Literal["epsilon", "v_prediction"]
TextLayer = Literal["last", "penultimate"]
UNetKeyLayout = Literal["diffusers", "original"]

# Cross-attention width (the text encoder's hidden size) of the released models.
_SD1_CONTEXT_DIM = 768  # OpenAI CLIP ViT-L/14
_SD2_CONTEXT_DIM = 1024  # OpenCLIP ViT-H/14


@dataclass(frozen=True)
class ModelFamily:
    """Everything the trainer and the file writers need to know about one kind of model.

    ``text_encoder_lora_prefixes`` are kohya's prefixes *without* the joining underscore
    (``lora_te`` + ``_`` + module path); there is one per entry of ``text_encoder_subfolders``,
    in the same order. ``unet_lora_prefix`` includes its underscore (``lora_unet_`` + path).
    """

    name: str
    v2: bool
    prediction_type: PredictionType
    base_model_version: str  # ss_base_model_version
    modelspec_architecture: str  # modelspec.architecture of a full model; LoRA files add "/lora"
    default_resolution: int
    text_encoder_subfolders: tuple[str, ...] = ("text_encoder",)
    tokenizer_subfolders: tuple[str, ...] = ("tokenizer",)
    text_encoder_lora_prefixes: tuple[str, ...] = ("lora_te",)
    unet_lora_prefix: str = "lora_unet_"
    # SDXL conditions the UNet on the pooled text embedding and on image sizes; SD1/2 do not.
    uses_pooled_text_embedding: bool = False
    uses_size_conditioning: bool = False
    # "last": each encoder's last_hidden_state (after the final layer norm; clip_skip applies).
    # "penultimate": hidden_states[-2] without the final norm, what SDXL was trained on.
    text_layer: TextLayer = "last"
    # UNet module names in LoRA files: diffusers paths (SD 1.x/2.x) or the original SGM layout
    # (SDXL; docs/formats.md, LoRA files). modelspec.implementation of a LoRA file follows it.
    unet_lora_key_layout: UNetKeyLayout = "diffusers"
    lora_implementation: str = "diffusers"
    # scaling_factor of the family's released VAE. Training reads the loaded VAE's config; this
    # is what VAE configs we write (tiny models) carry.
    latent_scale: float = 0.18215

    @property
    def v_parameterization(self) -> bool:
        """The training target is v (velocity) rather than the added noise."""
        return self.prediction_type == "v_prediction"

    @property
    def modelspec_prediction_type(self) -> str:
        """modelspec.prediction_type spells v-prediction as "v"."""
        return "v" if self.v_parameterization else "epsilon"

    @property
    def lora_architecture(self) -> str:
        """modelspec.architecture of a LoRA file trained on this family."""
        return f"{self.modelspec_architecture}/lora"


SD1 = ModelFamily(
    name="sd1",
    v2=False,
    prediction_type="epsilon",
    base_model_version="sd_v1",
    modelspec_architecture="stable-diffusion-v1",
    default_resolution=512,
)
SD2 = ModelFamily(
    name="sd2",
    v2=True,
    prediction_type="epsilon",
    base_model_version="sd_v2",
    modelspec_architecture="stable-diffusion-v2-512",
    default_resolution=512,
)
SD2_V = ModelFamily(
    name="sd2-v",
    v2=True,
    prediction_type="v_prediction",
    base_model_version="sd_v2_v",
    modelspec_architecture="stable-diffusion-v2-768-v",
    default_resolution=768,
)
# An SD 1.x fine-tune trained for v-prediction (kohya allows v_parameterization without v2).
# kohya names its base version "sd_v1_v"; modelspec has no v-variant of the v1 architecture, so it
# stays "stable-diffusion-v1" and modelspec.prediction_type carries the difference.
SD1_V = ModelFamily(
    name="sd1-v",
    v2=False,
    prediction_type="v_prediction",
    base_model_version="sd_v1_v",
    modelspec_architecture="stable-diffusion-v1",
    default_resolution=512,
)

# SDXL base 1.0: CLIP ViT-L (text_encoder) + OpenCLIP ViT-bigG with projection (text_encoder_2);
# the UNet takes both penultimate layers concatenated, the pooled bigG embedding and the image
# sizes (original size, crop top-left, target size).
SDXL = ModelFamily(
    name="sdxl",
    v2=False,
    prediction_type="epsilon",
    base_model_version="sdxl_base_v1-0",
    modelspec_architecture="stable-diffusion-xl-v1-base",
    default_resolution=1024,
    text_encoder_subfolders=("text_encoder", "text_encoder_2"),
    tokenizer_subfolders=("tokenizer", "tokenizer_2"),
    text_encoder_lora_prefixes=("lora_te1", "lora_te2"),
    uses_pooled_text_embedding=True,
    uses_size_conditioning=True,
    text_layer="penultimate",
    unet_lora_key_layout="original",
    lora_implementation="https://github.com/Stability-AI/generative-models",
    latent_scale=0.13025,
)
# SDXL fine-tunes trained for v-prediction; kohya keeps the base version name for them.
SDXL_V = dataclasses.replace(SDXL, name="sdxl-v", prediction_type="v_prediction")

# The SD 1.x/2.x families, told apart by (v2, prediction_type); SDXL is told by its UNet.
FAMILIES: tuple[ModelFamily, ...] = (SD1, SD2, SD2_V, SD1_V)


def family_for(v2: bool, prediction_type: PredictionType) -> ModelFamily:
    """The family with this (v2, prediction_type) pair."""
    for family in FAMILIES:
        if family.v2 == v2 and family.prediction_type == prediction_type:
            return family
    raise ValueError(f"no model family with v2={v2} and prediction_type={prediction_type!r}")


def _looks_like_sd2(unet_config: dict) -> bool:
    """SD 2.x by the UNet config: OpenCLIP's 1024-wide context.

    Models with a non-standard width (the tiny test models, research variants) fall back to the
    other SD 2.x marker: linear instead of 1x1-conv projections in the transformer blocks.
    """
    width = unet_config.get("cross_attention_dim")
    if width == _SD2_CONTEXT_DIM:
        return True
    if width == _SD1_CONTEXT_DIM:
        return False
    return bool(unet_config.get("use_linear_projection", False))


def _scheduler_prediction(scheduler_config: dict) -> PredictionType:
    value = scheduler_config.get("prediction_type", "epsilon")
    # "sample" (x0) prediction is not trained by kohya either; treat anything but v as epsilon.
    return "v_prediction" if value == "v_prediction" else "epsilon"


def is_sdxl_unet(unet_config: Mapping) -> bool:
    """An SDXL-style UNet: its added embedding takes a pooled text embedding and image sizes."""
    return unet_config.get("addition_embed_type") == "text_time"


def unet_lora_key_layout(unet_config: Mapping) -> UNetKeyLayout:
    """How LoRA files name the modules of a UNet with this config (its family's layout)."""
    return (SDXL if is_sdxl_unet(unet_config) else SD1).unet_lora_key_layout


def sdxl_for(prediction: PredictionType) -> ModelFamily:
    """SDXL, or its v-prediction variant."""
    return SDXL_V if prediction == "v_prediction" else SDXL


def detect_family(
    model: ModelSection,
    unet_config: dict,
    scheduler_config: dict,
    model_index: Mapping | None = None,
) -> ModelFamily:
    """Pick the family from the config flags, falling back to the model's own configs.

    SDXL when the UNet takes pooled text and size conditioning (``addition_embed_type``
    "text_time") or ``model_index`` names a StableDiffusionXLPipeline; ``model.v2`` does not
    apply to it. Otherwise ``model.v2`` unset: SD 2.x when the UNet's cross-attention width is
    1024 (see ``_looks_like_sd2`` for non-standard widths). ``model.v_parameterization`` unset:
    the scheduler config's prediction_type. A set flag always wins; a flag that contradicts the
    model is logged, since the user may know better (e.g. a converted model with a wrong config).
    """
    detected_pred = _scheduler_prediction(scheduler_config)
    if model.v_parameterization is None:
        prediction: PredictionType = detected_pred
    else:
        prediction = "v_prediction" if model.v_parameterization else "epsilon"
    if prediction != detected_pred:
        log.warning(
            "v_parameterization=%s but the scheduler config says prediction_type=%r; training "
            "with %s",
            model.v_parameterization,
            scheduler_config.get("prediction_type", "epsilon"),
            prediction,
        )
    index_class = str((model_index or {}).get("_class_name", ""))
    if is_sdxl_unet(unet_config) or index_class.startswith("StableDiffusionXL"):
        if model.v2:
            log.warning("v2 = true, but the model is SDXL; v2 applies to SD 2.x only, ignored")
        return sdxl_for(prediction)
    detected_v2 = _looks_like_sd2(unet_config)
    v2 = detected_v2 if model.v2 is None else model.v2
    if v2 != detected_v2:
        log.warning(
            "v2=%s but the UNet looks like SD %s (cross_attention_dim=%s); using v2=%s",
            v2,
            "2.x" if detected_v2 else "1.x",
            unet_config.get("cross_attention_dim"),
            v2,
        )
    return family_for(v2, prediction)
