"""The [flow] keys of the CLIP + T5-XXL transformer families (Flux.1 and SD3 read them all).

Their component files (CLIP-L, T5-XXL and T5's tokenizer), the fused-layer and T5 arguments of
kohya's networks, and T5's caption settings. Each key's field is its type, bounds and help; the
config's [flow] section is composed of these and every other family's keys
(library.config.flow_schema).
"""

from __future__ import annotations

from pydantic import Field

from library.config.section import Section


class TransformerFlowKeys(Section):
    """CLIP-L and T5-XXL files, kohya's fused-layer and T5 adapter arguments, T5 captions."""

    clip_l: str | None = Field(
        None,
        description="Flux.1 or SD3: the CLIP-L text encoder file (.safetensors, transformers' "
        "key names, as kohya and ComfyUI distribute clip_l). Needed with a Flux.1 transformer "
        "file; with SD3's model file unset takes the one inside; with a diffusers folder it "
        "replaces the folder's text_encoder/.",
    )
    t5xxl: str | None = Field(
        None,
        description="Flux.1 or SD3: the T5-XXL encoder file (.safetensors, transformers' "
        "T5EncoderModel key names; bf16, fp16 or fp8-stored). Needed with a Flux.1 transformer "
        "file; with SD3's model file unset takes the one inside; with a diffusers folder it "
        "replaces the folder's T5 (text_encoder_2/, SD3: text_encoder_3/).",
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
    train_t5xxl: bool | None = Field(
        None,
        description="kohya's networks.lora_flux / lora_sd3 argument (in network_args): with the "
        "text encoders training, also give T5-XXL an adapter (lora_te3_ names). Unset: false, "
        "the CLIP encoders only, as kohya.",
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
