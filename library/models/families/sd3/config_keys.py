"""SD3/SD3.5's own [flow] keys: its CLIP-G file, kohya's SD3 caption masks and dropouts, its
noise-level shift and SD3.5 Medium's position-embedding options (the CLIP-L/T5 keys it shares
with Flux.1 are transformer_keys.py's)."""

from __future__ import annotations

from pydantic import Field

from library.config.section import Section


class SD3FlowKeys(Section):
    """CLIP-G, kohya's SD3 caption options, training_shift and the position-embedding options."""

    clip_g: str | None = Field(
        None,
        description="SD3: the CLIP-G text encoder file (.safetensors, transformers' key names). "
        "Unset: the one inside the model file; with a diffusers folder it replaces the "
        "folder's text_encoder_2/.",
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
