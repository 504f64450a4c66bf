"""Tiny SD3 / SD3.5 component configs: the released layouts (library/models/families/sd3/shapes.py)
at a small width, for the tests' tiny models."""

from __future__ import annotations

from library.models.families.sd3.shapes import Variant, transformer_config, vae_config
from tests.kits.flux import tiny_shapes as flux_shapes
from tests.kits.sd.tiny import tiny_text_config

# Distinct widths for every stream, so a mix-up of two inputs fails on a shape. As in SD3, the
# two CLIP widths together fit in T5's (their hidden states are padded to it and joined).
TINY_CLIP_L_WIDTH = 16
TINY_CLIP_G_WIDTH = 24
TINY_T5_WIDTH = flux_shapes.TINY_T5_WIDTH  # 48: the transformer's joint_attention_dim
TINY_HEADS, TINY_HEAD_DIM = 2, 16  # transformer width 32
TINY_BLOCKS = 3
TINY_SIZE = 64  # pixels; the tiny VAE downsamples by 8 like the real one
# The position tables keep the full-size ratio: 3.5 Medium's is twice as wide as the others'.
TINY_POS_EMBED_MAX_SIZE: dict[str, int] = {"sd3-medium": 16, "sd3.5-medium": 32, "sd3.5-large": 16}
# One dual-attention block, one plain block, then the pre-only last block: each kind once.
TINY_DUAL_ATTENTION_LAYERS: dict[str, tuple[int, ...]] = {
    "sd3-medium": (),
    "sd3.5-medium": (0,),
    "sd3.5-large": (),
}


def tiny_transformer_config(variant: Variant = "sd3.5-medium") -> dict:
    """SD3Transformer2DModel kwargs: 3 blocks at width 32, with the variant's qk norm and dual
    attention, real in/out channels and patch size."""
    return {
        **transformer_config(variant),
        "sample_size": TINY_SIZE // 8,
        "num_layers": TINY_BLOCKS,
        "attention_head_dim": TINY_HEAD_DIM,
        "num_attention_heads": TINY_HEADS,
        "joint_attention_dim": TINY_T5_WIDTH,
        "caption_projection_dim": TINY_HEADS * TINY_HEAD_DIM,
        "pooled_projection_dim": TINY_CLIP_L_WIDTH + TINY_CLIP_G_WIDTH,
        "pos_embed_max_size": TINY_POS_EMBED_MAX_SIZE[variant],
        "dual_attention_layers": TINY_DUAL_ATTENTION_LAYERS[variant],
    }


def tiny_vae_config() -> dict:
    """AutoencoderKL kwargs: FLUX.1's tiny AE (four levels, 16 latent channels) with SD3's
    latent scale and shift."""
    return {
        **flux_shapes.tiny_ae_config(),
        "scaling_factor": vae_config()["scaling_factor"],
        "shift_factor": vae_config()["shift_factor"],
    }


def tiny_clip_l_config() -> dict:
    """CLIPTextConfig kwargs for the tiny CLIP tokenizer of tests/kits/sd/tiny.py: quick-GELU,
    a projection as wide as the tower."""
    return {
        **tiny_text_config("sd1"),
        "hidden_size": TINY_CLIP_L_WIDTH,
        "intermediate_size": 2 * TINY_CLIP_L_WIDTH,
        "num_attention_heads": 2,
        "projection_dim": TINY_CLIP_L_WIDTH,
    }


def tiny_clip_g_config() -> dict:
    """CLIPTextConfig kwargs for the same tokenizer: GELU like OpenCLIP, one layer more than
    CLIP-L's, a projection as wide as the tower."""
    return {
        **tiny_text_config("sd2"),
        "hidden_size": TINY_CLIP_G_WIDTH,
        "intermediate_size": 2 * TINY_CLIP_G_WIDTH,
        "num_hidden_layers": 3,
        "num_attention_heads": 2,
        "projection_dim": TINY_CLIP_G_WIDTH,
    }


def tiny_t5_config() -> dict:
    """T5Config kwargs of FLUX.1's tiny T5 (for the tiny T5 tokenizer of
    tests/kits/flux/tiny.py)."""
    return flux_shapes.tiny_t5_config()
