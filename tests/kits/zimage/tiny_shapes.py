"""Tiny Z-Image component configs: the released layout (library/models/families/zimage/shapes.py)
at a small width, for the tests' tiny models."""

from __future__ import annotations

from library.models.families.zimage.shapes import text_encoder_config, transformer_config
from tests.kits.flux.tiny_shapes import tiny_ae_config as flux_tiny_ae_config

TINY_DIM, TINY_HEADS = 32, 2  # transformer width and heads: head dim 16 = sum(TINY_AXES_DIMS)
TINY_AXES_DIMS = [4, 6, 6]  # even parts (RoPE rotates pairs)
TINY_TEXT_WIDTH = 40  # distinct from TINY_DIM, so a caption fed where an image goes fails
TINY_TEXT_VOCAB = 272  # more rows than the tiny tokenizer's 267 tokens, as Qwen3's 151936 has
TINY_SIZE = 64  # pixels: latents 8 x 8, 16 image tokens, padded to 32 inside the transformer


def tiny_transformer_config() -> dict:
    """ZImageTransformer2DModel kwargs: 2 joint + 2 + 2 refiner blocks at width 32.

    The timestep embedder keeps its fixed 1024-wide hidden layer (diffusers hard-codes it), so
    this is ~0.4M parameters. ``axes_lens`` stay the released ones: caption positions run past
    512 at the default caption length.
    """
    return {
        **transformer_config(),
        "dim": TINY_DIM,
        "n_layers": 2,
        "n_heads": TINY_HEADS,
        "n_kv_heads": TINY_HEADS,
        "cap_feat_dim": TINY_TEXT_WIDTH,
        "axes_dims": list(TINY_AXES_DIMS),
    }


def tiny_text_encoder_config() -> dict:
    """Qwen3Config kwargs: three layers (so hidden_states[-2] is neither the embeddings nor the
    last layer), grouped-query attention and a query width unlike the hidden size, as Qwen3-4B."""
    return {
        **text_encoder_config(),
        "vocab_size": TINY_TEXT_VOCAB,
        "hidden_size": TINY_TEXT_WIDTH,
        "intermediate_size": 64,
        "num_hidden_layers": 3,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 8,
        "max_position_embeddings": 1024,  # the pipeline's 512-token captions fit
    }


def tiny_ae_config() -> dict:
    """AutoencoderKL kwargs: the tiny FLUX.1 AE (four levels, 8x down, 16 latent channels)."""
    return flux_tiny_ae_config()
