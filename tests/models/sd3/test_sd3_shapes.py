"""SD3 / SD3.5 configs: full-size parameter counts on the meta device against the MMDiT's
architecture and the published sizes, and tiny configs that keep each variant's features."""

from __future__ import annotations

import pytest
import torch

from library.models.families.sd3 import shapes
from tests.kits.sd3 import tiny_shapes

# Published sizes of the MMDiTs (Stability AI's model cards and release posts), in parameters.
PUBLISHED = {"sd3-medium": 2.0e9, "sd3.5-medium": 2.5e9, "sd3.5-large": 8.1e9}
# The figures are rounded to one decimal (2B, 2.5B, 8.1B); 5% covers that rounding.
TOLERANCE = 0.05


def meta_transformer(config: dict):
    from diffusers import SD3Transformer2DModel

    with torch.device("meta"):
        return SD3Transformer2DModel(**config)


def mmdit_parameter_count(
    width: int, blocks: int, dual: tuple[int, ...], qk_norm: bool, head_dim: int = 64
) -> int:
    """The MMDiT's parameters from its architecture (sd-scripts library/sd3_models.py: MMDiT,
    MMDiTBlock, SingleDiTBlock, AttentionLinears, UnPatch), without the position table."""
    d = width

    def linear(i, o):
        return i * o + o

    norms = 2 * head_dim if qk_norm else 0  # RMSNorm scales of q and k, per attention
    attention = linear(d, 3 * d) + linear(d, d) + norms  # qkv, proj
    mlp = linear(d, 4 * d) + linear(4 * d, d)
    top = 16 * 2 * 2 * d + d  # x_embedder.proj: a 2x2 convolution from 16 latent channels
    top += linear(256, d) + linear(d, d)  # t_embedder: sinusoidal timestep features
    top += linear(shapes.POOLED_WIDTH, d) + linear(d, d)  # y_embedder: pooled CLIP-L + CLIP-G
    top += linear(4096, d)  # context_embedder: T5-XXL width in
    top += linear(d, 2 * 2 * 16) + linear(d, 2 * d)  # final layer: linear, adaLN (shift, scale)
    total = top
    for i in range(blocks):
        x_mods = 9 if i in dual else 6  # a dual block modulates its second attention too
        total += linear(d, x_mods * d) + attention + mlp
        total += attention if i in dual else 0
        if i == blocks - 1:  # pre-only context stream: q, k, v only, shift and scale
            total += linear(d, 2 * d) + linear(d, 3 * d) + norms
        else:
            total += linear(d, 6 * d) + attention + mlp
    return total


@pytest.mark.parametrize("variant", shapes.VARIANTS)
def test_full_size_transformer(variant):
    config = shapes.transformer_config(variant)
    model = meta_transformer(config)
    params = sum(p.numel() for p in model.parameters())
    width = shapes.HEAD_DIM * shapes.DEPTH[variant]
    expected = mmdit_parameter_count(
        width, shapes.DEPTH[variant], shapes.DUAL_ATTENTION_LAYERS[variant],
        shapes.QK_NORM[variant] is not None,
    )  # fmt: skip
    assert params == expected
    # The files also store the sin-cos position table (a buffer, not a parameter): 3.5 Medium's
    # 384 x 384 table (0.23 B numbers) is what makes its published 2.5 B.
    table = shapes.POS_EMBED_MAX_SIZE[variant] ** 2 * width
    stored = sum(v.numel() for v in model.state_dict().values())
    assert stored == params + table
    assert abs(stored - PUBLISHED[variant]) < TOLERANCE * PUBLISHED[variant]
    side = shapes.POS_EMBED_MAX_SIZE[variant]
    assert tuple(model.pos_embed.pos_embed.shape) == (1, side * side, width)


def test_full_size_widths():
    # sd3_utils.analyze_state_dict_state: width = 64 x depth, one 64-wide head per block.
    for variant, width in (("sd3-medium", 1536), ("sd3.5-medium", 1536), ("sd3.5-large", 2432)):
        config = shapes.transformer_config(variant)
        assert config["num_attention_heads"] * config["attention_head_dim"] == width
        assert config["caption_projection_dim"] == width
    assert shapes.transformer_config("sd3.5-medium")["dual_attention_layers"] == tuple(range(13))
    with pytest.raises(ValueError, match="unknown SD3 variant"):
        shapes.transformer_config("sd3-large")


def test_full_size_text_encoders_and_vae():
    from diffusers import AutoencoderKL
    from transformers import CLIPTextConfig, CLIPTextModelWithProjection

    def clip_count(d, ff, layers, projection):
        layer = 4 * (d * d + d) + d * ff + ff + ff * d + d + 2 * 2 * d
        return 49408 * d + 77 * d + layers * layer + 2 * d + d * projection

    with torch.device("meta"):
        clip_l = CLIPTextModelWithProjection(CLIPTextConfig(**shapes.clip_l_config()))
        clip_g = CLIPTextModelWithProjection(CLIPTextConfig(**shapes.clip_g_config()))
        vae = AutoencoderKL(**shapes.vae_config())
    assert sum(p.numel() for p in clip_l.parameters()) == clip_count(768, 3072, 12, 768)
    clip_g_count = sum(p.numel() for p in clip_g.parameters())
    assert clip_g_count == clip_count(1280, 5120, 32, 1280)
    assert 694.6e6 < clip_g_count < 694.7e6  # OpenCLIP's ViT-bigG/14 text tower: 694.7 M
    assert clip_l.config.hidden_act == "quick_gelu" and clip_g.config.hidden_act == "gelu"
    assert vae.config.latent_channels == 16 and vae.quant_conv is None
    assert (vae.config.scaling_factor, vae.config.shift_factor) == (1.5305, 0.0609)
    # The pooled outputs of the two projections are what the transformer's y_embedder takes.
    pooled = clip_l.config.projection_dim + clip_g.config.projection_dim
    assert pooled == shapes.transformer_config()["pooled_projection_dim"]


# --- tiny -------------------------------------------------------------------------------------


@pytest.mark.parametrize("variant", shapes.VARIANTS)
def test_tiny_transformer_keeps_the_variant_features(variant):
    config = tiny_shapes.tiny_transformer_config(variant)
    model = meta_transformer(config)
    state = model.state_dict()
    blocks = config["num_layers"]
    last = f"transformer_blocks.{blocks - 1}."
    # The last block's context stream is pre-only: no output projection, no MLP.
    assert model.transformer_blocks[-1].context_pre_only
    assert last + "ff_context.net.0.proj.weight" not in state
    assert last + "attn.to_add_out.weight" not in state
    assert "transformer_blocks.0.ff_context.net.0.proj.weight" in state
    qk = shapes.QK_NORM[variant] is not None
    assert ("transformer_blocks.0.attn.norm_q.weight" in state) == qk
    assert (last + "attn.norm_added_k.weight" in state) == qk
    dual = {i for i in range(blocks) if f"transformer_blocks.{i}.attn2.to_q.weight" in state}
    assert dual == ({0} if variant == "sd3.5-medium" else set())
    assert variant != "sd3.5-medium" or len(dual) < blocks - 1  # a plain block besides
    side = config["pos_embed_max_size"]
    assert config["sample_size"] // config["patch_size"] <= side
    assert tuple(state["pos_embed.pos_embed"].shape) == (1, side * side, 32)
    assert sum(v.numel() for v in state.values()) < 300_000


def test_tiny_widths_are_distinct():
    config = tiny_shapes.tiny_transformer_config()
    widths = [
        tiny_shapes.TINY_CLIP_L_WIDTH,
        tiny_shapes.TINY_CLIP_G_WIDTH,
        config["num_attention_heads"] * config["attention_head_dim"],
        config["pooled_projection_dim"],
        config["joint_attention_dim"],
    ]
    assert len(set(widths)) == len(widths)
    assert tiny_shapes.tiny_t5_config()["d_model"] == config["joint_attention_dim"]
    assert tiny_shapes.TINY_CLIP_L_WIDTH + tiny_shapes.TINY_CLIP_G_WIDTH <= tiny_shapes.TINY_T5_WIDTH
    assert tiny_shapes.tiny_clip_l_config()["projection_dim"] == tiny_shapes.TINY_CLIP_L_WIDTH
    assert tiny_shapes.tiny_clip_g_config()["projection_dim"] == tiny_shapes.TINY_CLIP_G_WIDTH
    assert tiny_shapes.tiny_vae_config()["shift_factor"] == shapes.vae_config()["shift_factor"]
