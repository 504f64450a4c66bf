"""The [flow] section: flow-matching models (Flux.1) in kohya's vocabulary.

Every key is unset by default. A flow-matching model fills the unset ones with kohya's defaults
(library.training.objectives.FlowOptions); a DDPM model (SD 1.x/2.x/SDXL) refuses any that is
set, since it would change nothing there.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from library.config.section import Section

TimestepSampling = Literal["sigma", "uniform", "sigmoid", "shift", "flux_shift"]
WeightingScheme = Literal["sigma_sqrt", "logit_normal", "mode", "cosmap", "none", "uniform"]
ModelPredictionType = Literal["raw", "additive", "sigma_scaled"]


class FlowSection(Section):
    """Flux.1's separate component files and the flow-matching training options."""

    clip_l: str | None = Field(
        None,
        description="Flux.1 given as a single transformer file: the CLIP-L text encoder file "
        "(.safetensors, transformers' key names, as kohya and ComfyUI distribute clip_l).",
    )
    t5xxl: str | None = Field(
        None,
        description="Flux.1 given as a single transformer file: the T5-XXL encoder file "
        "(.safetensors, transformers' T5EncoderModel key names; bf16, fp16 or fp8-stored).",
    )
    ae: str | None = Field(
        None,
        description="Flux.1 given as a single transformer file: the autoencoder file "
        "(Black Forest Labs' ae.safetensors layout, or diffusers' AutoencoderKL names).",
    )
    t5_tokenizer_path: str | None = Field(
        None,
        description="A folder with the T5 tokenizer (tokenizer.json, as in google/t5-v1_1-xxl "
        "or a Flux diffusers folder's tokenizer_2/). Unset: tokenizer_cache_dir, then the local "
        "Hugging Face cache. Nothing is downloaded.",
    )
    split_qkv: bool | None = Field(
        None,
        description="kohya's networks.lora_flux argument (in network_args): separate adapters "
        "for q, k and v (and the other parts of fused layers). difftune always trains them "
        "separately; false (one shared adapter per fused layer) is not supported yet.",
    )
    train_blocks: Literal["all", "single", "double"] | None = Field(
        None,
        description="kohya's networks.lora_flux argument (in network_args): which transformer "
        "blocks get adapters, all, the 38 single-stream or the 19 double-stream ones. Unset: "
        "all.",
    )
    train_t5xxl: bool | None = Field(
        None,
        description="kohya's networks.lora_flux argument (in network_args): with the text "
        "encoders training, also give T5-XXL an adapter (lora_te3_ names). Unset: false, CLIP-L "
        "only, as kohya.",
    )
    model_type: Literal["flux"] | None = Field(
        None, description='kohya\'s model_type; "flux" (Chroma is not supported yet).'
    )
    t5xxl_max_token_length: int | None = Field(
        None,
        ge=1,
        le=512,
        description="T5 tokens per caption. Unset: 512 for Flux.1 dev, 256 for schnell.",
    )
    apply_t5_attn_mask: bool | None = Field(
        None,
        description="Mask T5's padding tokens in the T5 encoder and the transformer's attention. "
        "Unset: false.",
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
        description="Density of the sigma draw (timestep_sampling sigma: logit_normal, mode, "
        "uniform) and loss weight of sigma_scaled (sigma_sqrt, cosmap). Unset: uniform.",
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
