"""The [flow] section: flow-matching models (Flux.1, SD3/SD3.5) in kohya's vocabulary.

Every key is unset by default. A flow-matching model fills the unset ones with kohya's defaults
(library.training.objectives.FlowOptions). Which family reads which key is its entry's in the
family registry (library.models.families.registry): a family refuses a set key it does not read,
naming the families that do, since it would change nothing there.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from library.config.section import Section

TimestepSampling = Literal["sigma", "uniform", "sigmoid", "shift", "flux_shift"]
WeightingScheme = Literal["sigma_sqrt", "logit_normal", "mode", "cosmap", "none", "uniform"]
ModelPredictionType = Literal["raw", "additive", "sigma_scaled"]


class FlowSection(Section):
    """The flow-matching families' separate component files and training options."""

    clip_l: str | None = Field(
        None,
        description="Flux.1 or SD3: the CLIP-L text encoder file (.safetensors, transformers' "
        "key names, as kohya and ComfyUI distribute clip_l). Needed with a Flux.1 transformer "
        "file; with SD3's model file unset takes the one inside; with a diffusers folder it "
        "replaces the folder's text_encoder/.",
    )
    clip_g: str | None = Field(
        None,
        description="SD3: the CLIP-G text encoder file (.safetensors, transformers' key names). "
        "Unset: the one inside the model file; with a diffusers folder it replaces the "
        "folder's text_encoder_2/.",
    )
    t5xxl: str | None = Field(
        None,
        description="Flux.1 or SD3: the T5-XXL encoder file (.safetensors, transformers' "
        "T5EncoderModel key names; bf16, fp16 or fp8-stored). Needed with a Flux.1 transformer "
        "file; with SD3's model file unset takes the one inside; with a diffusers folder it "
        "replaces the folder's T5 (text_encoder_2/, SD3: text_encoder_3/).",
    )
    ae: str | None = Field(
        None,
        description="Flux.1: the autoencoder file (Black Forest Labs' ae.safetensors layout, or "
        "diffusers' AutoencoderKL names). Needed with a transformer file; with a diffusers "
        "folder it replaces the folder's vae/.",
    )
    text_encoder: str | None = Field(
        None,
        description="Z-Image: the Qwen3-4B text encoder file (.safetensors, transformers' key "
        "names with or without model., as ComfyUI distributes qwen_3_4b.safetensors; "
        "musubi-tuner's --text_encoder). Needed with a transformer file; with a diffusers "
        "folder it replaces the folder's text_encoder/.",
    )
    t5_tokenizer_path: str | None = Field(
        None,
        description="A folder with the T5 tokenizer (tokenizer.json, as in google/t5-v1_1-xxl "
        "or a Flux diffusers folder's tokenizer_2/). Unset: a diffusers folder's own, else "
        "tokenizer_cache_dir, then the local Hugging Face cache. Nothing is downloaded. Checked "
        "against the T5 encoder's config (kind, vocabulary, end and padding ids).",
    )
    split_qkv: bool | None = Field(
        None,
        description="kohya's networks.lora_flux / lora_sd3 argument (in network_args): separate "
        "adapters for q, k and v (and the other parts of fused layers). difftune always trains "
        "them separately; false (one shared adapter per fused layer) is not supported yet.",
    )
    train_blocks: Literal["all", "single", "double"] | None = Field(
        None,
        description="kohya's networks.lora_flux argument (in network_args): which transformer "
        "blocks get adapters, all, the 38 single-stream or the 19 double-stream ones. Unset: "
        "all.",
    )
    train_t5xxl: bool | None = Field(
        None,
        description="kohya's networks.lora_flux / lora_sd3 argument (in network_args): with the "
        "text encoders training, also give T5-XXL an adapter (lora_te3_ names). Unset: false, "
        "the CLIP encoders only, as kohya.",
    )
    model_type: Literal["flux"] | None = Field(
        None, description='kohya\'s model_type; "flux" (Chroma is not supported yet).'
    )
    t5xxl_max_token_length: int | None = Field(
        None,
        ge=1,
        le=512,
        description="T5 tokens per caption. Unset: 512 for Flux.1 dev, 256 for schnell and SD3.",
    )
    apply_t5_attn_mask: bool | None = Field(
        None,
        description="Mask T5's padding tokens in the T5 encoder (Flux.1: and in the "
        "transformer's attention). Unset: false.",
    )
    apply_lg_attn_mask: bool | None = Field(
        None,
        description="SD3: mask the caption's padding tokens inside CLIP-L and CLIP-G. Unset: false.",
    )
    clip_l_dropout_rate: float | None = Field(
        None,
        ge=0,
        le=1,
        description="SD3: the share of samples whose CLIP-L output (hidden states and pooled) is "
        "replaced by zeros, drawn per sample. Unset: 0.",
    )
    clip_g_dropout_rate: float | None = Field(
        None, ge=0, le=1, description="SD3: the same for CLIP-G. Unset: 0."
    )
    t5_dropout_rate: float | None = Field(
        None, ge=0, le=1, description="SD3: the same for T5-XXL's hidden states. Unset: 0."
    )
    training_shift: float | None = Field(
        None,
        gt=0,
        description="SD3: shift s of the drawn noise level, u -> s*u / (1 + (s-1)*u), after "
        "weighting_scheme's density; above 1 trains more on noisy levels. Unset: 1.",
    )
    enable_scaled_pos_embed: bool | None = Field(
        None,
        description="SD3 (kohya's SD3.5 Medium option): give each dataset resolution its own "
        "position table, scaled so its central crop spans the same coordinates at every "
        "resolution, instead of cropping the stored one. Unset: false.",
    )
    pos_emb_random_crop_rate: float | None = Field(
        None,
        ge=0,
        le=1,
        description="SD3 (kohya's SD3.5 Medium option): the share of training samples whose "
        "position embeddings are cropped from the table at a random offset (drawn per sample) "
        "instead of its centre. Unset: 0.",
    )
    guidance_scale: float | None = Field(
        None,
        ge=0,
        description="The distilled guidance value Flux.1 dev is trained with (its guidance "
        "embedding). Unset: 3.5; 1.0 is common for LoRA training. schnell has no guidance input.",
    )
    timestep_sampling: TimestepSampling | None = Field(
        None,
        description="How each sample's noise level sigma is drawn: sigma (an index into the "
        "shifted 1000-step schedule, by weighting_scheme), uniform, sigmoid (sigmoid of "
        "sigmoid_scale * normal), shift (sigmoid, then discrete_flow_shift), flux_shift (sigmoid, "
        "then Flux's resolution-dependent shift). Unset: sigma.",
    )
    sigmoid_scale: float | None = Field(
        None, gt=0, description="Scale of the normal draw in sigmoid/shift/flux_shift. Unset: 1."
    )
    discrete_flow_shift: float | None = Field(
        None,
        gt=0,
        description="Shift s of sigma -> s*sigma / (1 + (s-1)*sigma) for timestep_sampling shift "
        "and of the sigma schedule. Unset: 3.",
    )
    model_prediction_type: ModelPredictionType | None = Field(
        None,
        description="How the transformer's output is compared with the velocity target: raw "
        "(as is), additive (plus the noisy input), sigma_scaled (noisy input - sigma * output, "
        "weighted by weighting_scheme). Unset: sigma_scaled, kohya's default; kohya's docs "
        "recommend raw for Flux.1.",
    )
    weighting_scheme: WeightingScheme | None = Field(
        None,
        description="Density of the sigma draw (Flux.1's timestep_sampling sigma, and SD3: "
        "logit_normal, mode, uniform) and loss weight of sigma_scaled and SD3 (sigma_sqrt, "
        "cosmap). Unset: uniform.",
    )
    logit_mean: float | None = Field(
        None, description="Mean of weighting_scheme logit_normal. Unset: 0."
    )
    logit_std: float | None = Field(
        None, gt=0, description="Standard deviation of weighting_scheme logit_normal. Unset: 1."
    )
    mode_scale: float | None = Field(
        None, description="Scale of weighting_scheme mode. Unset: 1.29."
    )
