"""Tiny Chroma transformer config: the released layout (library/models/families/chroma/shapes.py)
at a small width, reading the tiny FLUX.1 T5's states."""

from __future__ import annotations

from library.models.families.chroma.shapes import transformer_config
from tests.kits.flux import tiny_shapes as flux_shapes


def tiny_transformer_config() -> dict:
    """2 double + 2 single blocks at width 32 reading the tiny T5's 48-wide states, with a
    2-layer approximator of width 24 (its 16 input channels: 4 timestep, 4 guidance and 8
    modulation-index features)."""
    return {
        **transformer_config(),
        "num_layers": 2,
        "num_single_layers": 2,
        "attention_head_dim": flux_shapes.TINY_HEAD_DIM,
        "num_attention_heads": flux_shapes.TINY_HEADS,
        "joint_attention_dim": flux_shapes.TINY_T5_WIDTH,
        "axes_dims_rope": (4, 6, 6),
        "approximator_num_channels": 16,
        "approximator_hidden_dim": 24,
        "approximator_layers": 2,
    }
