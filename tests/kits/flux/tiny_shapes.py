"""Tiny FLUX.1 component configs: the released layout (library/models/families/flux/shapes.py)
at a small width, for the tests' tiny models."""

from __future__ import annotations

from library.models.families.flux.shapes import (
    Variant,
    ae_config,
    t5_xxl_config,
    transformer_config,
)
from tests.kits.sd.tiny import tiny_text_config

# Distinct widths for every stream, so a mix-up of two inputs fails on a shape.
TINY_CLIP_WIDTH = 24  # pooled text: the transformer's pooled_projection_dim
TINY_T5_WIDTH = 48  # T5 hidden states: the transformer's joint_attention_dim
TINY_HEADS, TINY_HEAD_DIM = 2, 16  # transformer width 32
TINY_T5_VOCAB_SIZE = 128  # more rows than the tiny tokenizer has pieces, as in T5-XXL
TINY_SIZE = 64  # pixels; the tiny AE downsamples by 8 like the real one


def tiny_transformer_config(variant: Variant = "dev") -> dict:
    """FluxTransformer2DModel kwargs: 2 double + 2 single blocks at width 32, real in/out."""
    return {
        **transformer_config(variant),
        "num_layers": 2,
        "num_single_layers": 2,
        "attention_head_dim": TINY_HEAD_DIM,
        "num_attention_heads": TINY_HEADS,
        "joint_attention_dim": TINY_T5_WIDTH,
        "pooled_projection_dim": TINY_CLIP_WIDTH,
        "axes_dims_rope": (4, 6, 6),  # (index, row, column); even, summing to the head dim
    }


def tiny_ae_config() -> dict:
    """AutoencoderKL kwargs: four levels (8x down) and 16 latent channels, at small width."""
    return {
        **ae_config(),
        # Two channel changes, as (128, 256, 512, 512) has, so both the encoder and the decoder
        # carry nin_shortcut convolutions.
        "block_out_channels": (8, 16, 32, 32),
        "layers_per_block": 1,
        "norm_num_groups": 8,
        "sample_size": TINY_SIZE,
    }


def tiny_clip_config() -> dict:
    """CLIPTextConfig kwargs for the tiny CLIP tokenizer of tests/kits/sd/tiny.py."""
    return {
        **tiny_text_config("sd1"),  # quick-GELU, 77 positions, the tiny tokenizer's ids
        "hidden_size": TINY_CLIP_WIDTH,
        "intermediate_size": 2 * TINY_CLIP_WIDTH,
        "num_attention_heads": 2,
        "projection_dim": TINY_CLIP_WIDTH,
    }


def tiny_t5_config() -> dict:
    """T5Config kwargs: two gated-GELU layers for the tiny T5 tokenizer
    (tests/kits/flux/tiny.py)."""
    return {
        **t5_xxl_config(),
        "vocab_size": TINY_T5_VOCAB_SIZE,
        "d_model": TINY_T5_WIDTH,
        "d_kv": 12,  # heads * d_kv = d_model, as in XXL
        "d_ff": 2 * TINY_T5_WIDTH,
        "num_layers": 2,
        "num_decoder_layers": 2,
        "num_heads": 4,
    }
