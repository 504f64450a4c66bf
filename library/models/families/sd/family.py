"""The Stable Diffusion families: SD 1.x, SD 2.x (512 and 768-v), SDXL, and v-prediction variants.

One implementation of library.models.families.base.ModelFamily for every UNet/CLIP/DDPM model;
the variants are instances that differ in data (prediction target, which text encoders exist
and which of their layers condition the UNet, pooled/size conditioning, LoRA key prefixes and
UNet key layout, metadata strings). SDXL is one more instance with two entries in the
text-encoder tuples and its pooled/size conditioning switched on.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import ClassVar, Literal

from library.config.model_schema import ModelSection
from library.errors import ConfigError
from library.models.conditioning import clip_text_conditioning, unet_conditioning
from library.models.families.base import ModelFamily, PredictionType
from library.models.families.sd.blocks import blockwise_spec
from library.models.families.sd.checkpoint_layout import LAYOUTS
from library.networks.key_maps import KohyaNames
from library.networks.lycoris_targets import lycoris_targets
from library.networks.targets import default_targets
from library.sampling.pipelines import PipelineKind
from library.saving.checkpoint_export import export_full_unet_checkpoint

log = logging.getLogger(__name__)

TextLayer = Literal["last", "penultimate"]
UNetKeyLayout = Literal["diffusers", "original"]

# Cross-attention width (the text encoder's hidden size) of the released models.
_SD1_CONTEXT_DIM = 768  # OpenAI CLIP ViT-L/14
_SD2_CONTEXT_DIM = 1024  # OpenCLIP ViT-H/14


@dataclass(frozen=True, kw_only=True)
class SDFamily(ModelFamily):
    """SD 1.x, 2.x and SDXL: a UNet denoiser, CLIP text encoders, the DDPM objective.

    Besides ModelFamily's data: which layer of each text encoder conditions the UNet, and the
    key layout of UNet modules in LoRA files.
    """

    # kohya's default step, the grid of SD 1.x/2.x's UNets (SDXL's is 32); bucket_grid below
    # has each model's own
    BUCKET_STEP: ClassVar[int | None] = 64

    # "last": each encoder's last_hidden_state (after the final layer norm; clip_skip applies).
    # "penultimate": hidden_states[-2] without the final norm, what SDXL was trained on.
    text_layer: TextLayer = "last"
    # UNet module names in LoRA files: diffusers paths (SD 1.x/2.x) or the original SGM layout
    # (SDXL; docs/formats.md, LoRA files). modelspec.implementation of a LoRA file follows it.
    unet_lora_key_layout: UNetKeyLayout = "diffusers"

    def predict(self, denoiser, noisy, timesteps, cond):
        return denoiser(noisy, timesteps, cond.encoder_hidden_states, **cond.unet_kwargs).sample

    def encode_text(
        self, tokenizers, text_encoders, captions, device, clip_skip=None, max_token_length=None
    ):
        return clip_text_conditioning(
            self, tokenizers, text_encoders, captions, device, clip_skip, max_token_length
        )

    def assemble_conditioning(self, text, batch, device, dtype=None):
        return unet_conditioning(self, text, batch, device, dtype)

    def unused_text_layers(self, index, num_layers, clip_skip=None):
        """SDXL's first encoder conditions on its penultimate layer, so its last layer is
        unused; with ``clip_skip`` N > 1 the last N - 1 layers are. An encoder that gives the
        pooled embedding uses every layer."""
        last = len(self.text_encoder_subfolders) - 1
        if self.uses_pooled_text_embedding and index == last:
            return range(num_layers, num_layers)
        used = (
            num_layers - 1
            if self.text_layer == "penultimate"
            else num_layers - (clip_skip or 1) + 1
        )
        return range(max(used, 0), num_layers)

    def adapter_targets(self, module, role, conv):
        return default_targets(module, role, conv)

    def lycoris_targets(self, module, role, preset):
        from diffusers import UNet2DConditionModel

        # sd-scripts' SDXL UNet names conv_in & co. otherwise, so LyCORIS skips them there.
        sd_names = (
            isinstance(module, UNet2DConditionModel)
            and unet_lora_key_layout(module.config) != "original"
        )
        return lycoris_targets(module, role, preset, named_layers=sd_names)

    def adapter_key_map(self):
        """kohya's one-to-one names, a UNet's in the layout its config has (the original one
        for SDXL's: unet_lora_key_layout)."""
        return KohyaNames(self.text_encoder_lora_prefixes, unet_lora_key_layout)

    def bucket_grid(self, denoiser):
        """The VAE's 8 times 2 per UNet downsampling stage (64 for SD 1.x/2.x, 32 for SDXL)."""
        return 8 * 2 ** (len(denoiser.config.block_out_channels) - 1)

    def use_plain_attention(self, denoiser):
        from diffusers.models.attention_processor import AttnProcessor

        denoiser.set_attn_processor(AttnProcessor())

    def sampling_pipeline(self):
        key = (
            len(self.text_encoder_subfolders),
            self.uses_pooled_text_embedding,
            self.uses_size_conditioning,
        )
        found = _PIPELINES.get(key)
        if found is None:
            return super().sampling_pipeline()
        class_name, options = found
        return PipelineKind(class_name, dict(options))

    def checkpoint_layout(self):
        """SDXL (two text encoders), SD 2.x or SD 1.x original layout."""
        if len(self.text_encoder_subfolders) > 1 or self.uses_pooled_text_embedding:
            return LAYOUTS["sdxl"]
        return LAYOUTS["sd2" if self.v2 else "sd1"]

    def write_full_model(self, path, denoiser, components, metadata, dtype):
        """One original-layout checkpoint: the trained UNet with the base VAE and text
        encoders (A1111/Forge, ComfyUI)."""
        export_full_unet_checkpoint(path, denoiser, components, self, dtype, metadata)

    def blockwise_spec(self, args, dim, alpha, conv_dim, conv_alpha):
        return blockwise_spec(
            args,
            dim=dim,
            alpha=alpha,
            conv_dim=conv_dim,
            conv_alpha=conv_alpha,
            sdxl=self.name.startswith("sdxl"),
        )

    def check_options(self, model, flow):
        given = [key for key in type(flow).model_fields if getattr(flow, key) is not None]
        if given:
            owners = " and ".join(entry.label for entry in flow.readers(given[0]))
            raise ConfigError(
                f"{given[0]} is a flow-matching ({owners}) key and {self.name} models train with "
                f"DDPM, where it changes nothing; remove it"
            )
        if model.zero_terminal_snr and not self.v_parameterization:
            raise ConfigError(
                "zero_terminal_snr needs v-prediction: with epsilon prediction the last timestep "
                "has nothing to learn and samplers divide by zero there; set "
                "v_parameterization = true or remove zero_terminal_snr"
            )
        if model.clip_skip and model.clip_skip > 1 and self.uses_pooled_text_embedding:
            # sd-scripts warns and trains; so do we (anime SDXL presets carry clip_skip = 2)
            log.warning(
                "clip_skip = %d is ignored: SDXL conditions on its text encoders' penultimate "
                "layers whatever it says (sd-scripts ignores it for SDXL too)",
                model.clip_skip,
            )


# (text encoders, pooled text embedding, size conditioning) -> the diffusers pipeline class that
# takes them, and its constructor keywords besides the modules.
_PIPELINES = {
    (1, False, False): (
        "StableDiffusionPipeline",
        {"safety_checker": None, "feature_extractor": None, "requires_safety_checker": False},
    ),
    # No invisible watermark: it needs an extra package and alters the pixels users compare.
    (2, True, True): ("StableDiffusionXLPipeline", {"add_watermarker": False}),
}


SD1 = SDFamily(
    name="sd1",
    v2=False,
    prediction_type="epsilon",
    base_model_version="sd_v1",
    modelspec_architecture="stable-diffusion-v1",
    default_resolution=512,
)
SD2 = SDFamily(
    name="sd2",
    v2=True,
    prediction_type="epsilon",
    base_model_version="sd_v2",
    modelspec_architecture="stable-diffusion-v2-512",
    default_resolution=512,
)
SD2_V = SDFamily(
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
SD1_V = SDFamily(
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
SDXL = SDFamily(
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
FAMILIES: tuple[SDFamily, ...] = (SD1, SD2, SD2_V, SD1_V)


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
