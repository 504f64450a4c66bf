"""SD3 / SD3.5 original (Stability) <-> diffusers names: round trips, diffusers' own single-file
converter as the reference, full-size key sets on the meta device, file detection, and configs
read off the shapes."""

from __future__ import annotations

import logging

import pytest
import torch

from library.models.families.sd3 import original_keys as keys
from library.models.families.sd3 import shapes
from tests.kits.sd3 import tiny_shapes
from tests.kits.sd3.tiny import build_tiny_sd3_components


@pytest.fixture(scope="module")
def tiny():
    return {v: build_tiny_sd3_components(v, seed=3) for v in shapes.VARIANTS}


def transformer_state(tiny, variant: str) -> dict[str, torch.Tensor]:
    return tiny[variant]["transformer"].state_dict()


def assert_same(got: dict, want: dict) -> None:
    assert set(got) == set(want)
    for key, value in want.items():
        assert got[key].shape == value.shape, key
        assert torch.equal(got[key], value), key


def diffusers_convert(original: dict[str, torch.Tensor], prefix: str = keys.ORIGINAL_PREFIX):
    """diffusers' single-file converter on ``original`` (given with ``prefix``); it pops every
    key it reads, so what it leaves behind was not converted."""
    from diffusers.loaders.single_file_utils import convert_sd3_transformer_checkpoint_to_diffusers

    checkpoint = {prefix + k: v for k, v in original.items()}
    converted = convert_sd3_transformer_checkpoint_to_diffusers(checkpoint)
    assert checkpoint == {}
    return converted


# --- hand-written names -----------------------------------------------------------------------

# From Stability's module definitions (sd-scripts library/sd3_models.py: MMDiT, MMDiTBlock,
# SingleDiTBlock, AttentionLinears, UnPatch) and diffusers' transformer_sd3.py; one per kind.
KNOWN = [
    ("x_embedder.proj.weight", "pos_embed.proj.weight"),
    ("pos_embed", "pos_embed.pos_embed"),
    ("t_embedder.mlp.2.bias", "time_text_embed.timestep_embedder.linear_2.bias"),
    ("y_embedder.mlp.0.weight", "time_text_embed.text_embedder.linear_1.weight"),
    ("context_embedder.bias", "context_embedder.bias"),
    ("joint_blocks.1.x_block.adaLN_modulation.1.weight", "transformer_blocks.1.norm1.linear.weight"),
    ("joint_blocks.0.x_block.attn.proj.bias", "transformer_blocks.0.attn.to_out.0.bias"),
    ("joint_blocks.1.x_block.attn.ln_k.weight", "transformer_blocks.1.attn.norm_k.weight"),
    ("joint_blocks.0.x_block.attn2.ln_q.weight", "transformer_blocks.0.attn2.norm_q.weight"),
    ("joint_blocks.0.x_block.attn2.proj.weight", "transformer_blocks.0.attn2.to_out.0.weight"),
    ("joint_blocks.1.x_block.mlp.fc1.bias", "transformer_blocks.1.ff.net.0.proj.bias"),
    ("joint_blocks.0.context_block.adaLN_modulation.1.bias", "transformer_blocks.0.norm1_context.linear.bias"),
    ("joint_blocks.2.context_block.attn.ln_q.weight", "transformer_blocks.2.attn.norm_added_q.weight"),
    ("joint_blocks.1.context_block.attn.proj.weight", "transformer_blocks.1.attn.to_add_out.weight"),
    ("joint_blocks.0.context_block.mlp.fc2.weight", "transformer_blocks.0.ff_context.net.2.weight"),
    ("final_layer.linear.bias", "proj_out.bias"),
]  # fmt: skip


def test_known_names(tiny):
    state = transformer_state(tiny, "sd3.5-medium")
    original = keys.transformer_to_original(state)
    for old, new in KNOWN:
        assert torch.equal(original[old], state[new]), old


def test_fused_and_swapped_parts(tiny):
    """q|k|v are stacked in that order; the final layer's and the last (pre-only) context
    stream's modulations are (shift, scale) in the original, (scale, shift) in diffusers."""
    state = transformer_state(tiny, "sd3.5-medium")
    original = keys.transformer_to_original(state)
    fused = {
        "context_block.attn.qkv": ("attn.add_q_proj", "attn.add_k_proj", "attn.add_v_proj"),
        "x_block.attn2.qkv": ("attn2.to_q", "attn2.to_k", "attn2.to_v"),
    }
    for old, parts in fused.items():
        qkv = original[f"joint_blocks.0.{old}.weight"]
        for piece, part in zip(qkv.chunk(3), parts, strict=True):
            assert torch.equal(piece, state[f"transformer_blocks.0.{part}.weight"])
    last = tiny_shapes.TINY_BLOCKS - 1
    swapped = {
        f"joint_blocks.{last}.context_block.adaLN_modulation.1": (
            f"transformer_blocks.{last}.norm1_context.linear"
        ),
        "final_layer.adaLN_modulation.1": "norm_out.linear",
    }
    for name, stem in swapped.items():
        for param in ("weight", "bias"):
            shift, scale = original[f"{name}.{param}"].chunk(2)
            assert torch.equal(torch.cat([scale, shift]), state[f"{stem}.{param}"])
    # The other blocks' context modulations (6 chunks, AdaLayerNormZero) keep their order.
    name = "joint_blocks.0.context_block.adaLN_modulation.1.weight"
    assert torch.equal(original[name], state["transformer_blocks.0.norm1_context.linear.weight"])
    assert original[name].shape[0] == 6 * 32
    assert (
        original[f"joint_blocks.{last}.context_block.adaLN_modulation.1.weight"].shape[0] == 2 * 32
    )
    # A dual-attention block modulates nine ways: (shift, scale, gate) x (attn, mlp, attn2).
    assert original["joint_blocks.0.x_block.adaLN_modulation.1.weight"].shape[0] == 9 * 32
    assert original["joint_blocks.1.x_block.adaLN_modulation.1.weight"].shape[0] == 6 * 32


# --- round trips and diffusers' converter -----------------------------------------------------


def test_unknown_and_incomplete_keys_fail(tiny):
    state = transformer_state(tiny, "sd3.5-large")
    with pytest.raises(ValueError, match="not a key"):
        keys.transformer_to_original({**state, "x_embedder.weight": torch.zeros(1)})
    incomplete = {k: v for k, v in state.items() if k != "transformer_blocks.0.attn.to_k.weight"}
    with pytest.raises(ValueError, match="missing"):
        keys.transformer_to_original(incomplete)
    for key in (
        "text_encoders.clip_l.transformer.text_model.final_layer_norm.weight",
        "first_stage_model.encoder.conv_in.weight",
        "double_blocks.0.img_attn.qkv.weight",
    ):
        with pytest.raises(ValueError, match="not a key"):
            keys.transformer_from_original({key: torch.zeros(1)})  # fmt: skip


# --- what the conformance suite does not know ------------------------------------------------
# (tests/conformance: the round trips, diffusers' converters and fp8 for every family)


@pytest.mark.parametrize("variant", shapes.VARIANTS)
def test_prefixed_keys(tiny, variant):
    """Keys inside a model file (model.diffusion_model.) read as bare ones, and back."""
    state = transformer_state(tiny, variant)
    original = keys.transformer_to_original(state)
    prefixed = {keys.ORIGINAL_PREFIX + k: v for k, v in original.items()}
    assert_same(keys.transformer_from_original(prefixed), state)
    assert_same(keys.transformer_to_original(keys.transformer_from_original(prefixed)), original)
    assert_same(diffusers_convert(original, ""), state)  # diffusers reads bare keys too


def test_vae_original_layout(tiny):
    original = keys.ae_to_original(tiny["sd3-medium"]["vae"].state_dict())
    assert not any(k.startswith(("quant_conv", "post_quant_conv")) for k in original)


# --- full size, on the meta device ------------------------------------------------------------


def meta_state(variant: str) -> dict[str, torch.Tensor]:
    from diffusers import SD3Transformer2DModel

    with torch.device("meta"):
        return SD3Transformer2DModel(**shapes.transformer_config(variant)).state_dict()


# Tensors of the released files: per block 10 for each stream (modulation, qkv, proj, fc1, fc2:
# weight + bias) plus 2 q/k norm scales each with qk norm, a dual-attention block 4 (+2) more
# for attn2, the last block's pre-only context stream only its modulation and qkv (4, +2); top
# level 17 (x_embedder.proj 2, pos_embed 1, t_embedder 4, y_embedder 4, context_embedder 2,
# final layer 4). SD3 Medium: 23 * 20 + 14 + 17; 3.5 Large: 37 * 24 + 18 + 17; 3.5 Medium: 23 *
# 24 + 13 * 6 + 18 + 17.
FILE_TENSORS = {"sd3-medium": 491, "sd3.5-medium": 665, "sd3.5-large": 923}


@pytest.mark.parametrize("variant", shapes.VARIANTS)
def test_full_size_transformer(variant):
    state = meta_state(variant)
    original = keys.transformer_to_original(state)
    assert len(original) == FILE_TENSORS[variant]
    width = shapes.HEAD_DIM * shapes.DEPTH[variant]
    last = shapes.DEPTH[variant] - 1
    expected_shapes = {
        "x_embedder.proj.weight": (width, 16, 2, 2),
        "pos_embed": (1, shapes.POS_EMBED_MAX_SIZE[variant] ** 2, width),
        "y_embedder.mlp.0.weight": (width, 2048),
        "context_embedder.weight": (width, 4096),
        "joint_blocks.0.x_block.attn.qkv.weight": (3 * width, width),
        "joint_blocks.0.context_block.adaLN_modulation.1.bias": (6 * width,),
        f"joint_blocks.{last}.context_block.adaLN_modulation.1.weight": (2 * width, width),
        f"joint_blocks.{last}.x_block.mlp.fc1.weight": (4 * width, width),
        "final_layer.linear.weight": (2 * 2 * 16, width),
        "final_layer.adaLN_modulation.1.weight": (2 * width, width),
    }
    for key, shape in expected_shapes.items():
        assert tuple(original[key].shape) == shape, key
    assert f"joint_blocks.{last}.context_block.attn.proj.weight" not in original
    # diffusers' single_file_utils tells the variants apart by these: SD3 Medium's first context
    # modulation is 9216 wide and its position table 36864 (192^2), 3.5 Medium's 147456 (384^2);
    # 3.5 Large has a block 37.
    if variant != "sd3.5-large":
        assert original["joint_blocks.0.context_block.adaLN_modulation.1.bias"].shape == (9216,)
    assert original["pos_embed"].shape[1] == {"sd3.5-medium": 147456}.get(variant, 36864)
    assert ("joint_blocks.37.x_block.mlp.fc1.weight" in original) == (variant == "sd3.5-large")

    reference = diffusers_convert(original)
    ours = keys.transformer_from_original(
        {keys.ORIGINAL_PREFIX + k: v for k, v in original.items()}
    )
    assert {k: v.shape for k, v in ours.items()} == {k: v.shape for k, v in reference.items()}
    assert {k: v.shape for k, v in reference.items()} == {k: v.shape for k, v in state.items()}
    shape_list = {k: tuple(v.shape) for k, v in original.items()}
    assert keys.convert_shapes(keys.transformer_from_original, shape_list) == {
        k: tuple(v.shape) for k, v in state.items()
    }
    assert keys.detect_sd3(original) == ("original", "")
    diffusers_shapes = {k: tuple(v.shape) for k, v in state.items()}
    assert keys.transformer_config_from_shapes(diffusers_shapes) == shapes.transformer_config(
        variant
    )


# --- detection --------------------------------------------------------------------------------


def sd3_file_keys(tiny, variant: str, inside: tuple[str, ...] = ()) -> list[str]:
    """Key names of a Stability-style single file: the MMDiT under model.diffusion_model., with
    ``inside`` among "vae", "clip_l", "clip_g", "t5xxl"."""
    parts = tiny[variant]
    out = [
        keys.ORIGINAL_PREFIX + k
        for k in keys.transformer_to_original(parts["transformer"].state_dict())
    ]
    if "vae" in inside:
        out += [keys.VAE_PREFIX + k for k in keys.ae_to_original(parts["vae"].state_dict())]
    for name, sub in (
        ("clip_l", "text_encoder"),
        ("clip_g", "text_encoder_2"),
        ("t5xxl", "text_encoder_3"),
    ):
        if name in inside:
            out += [keys.TEXT_ENCODER_PREFIXES[name] + k for k in parts[sub].state_dict()]
    return out  # fmt: skip


@pytest.mark.parametrize("variant", shapes.VARIANTS)
def test_detect_sd3(tiny, variant):
    """Each layout and prefix, with or without other parts inside, as the family spec's main
    file finds them too."""
    from library.models.families.sd3.spec import SPEC

    state = transformer_state(tiny, variant)
    original = keys.transformer_to_original(state)
    prefix = keys.ORIGINAL_PREFIX
    cases = (
        (("original", ""), original),
        (("diffusers", ""), state),
        (("original", prefix), sd3_file_keys(tiny, variant)),
        (("original", prefix), sd3_file_keys(tiny, variant, ("vae", "clip_l", "clip_g", "t5xxl"))),
    )  # fmt: skip
    for want, file_keys in cases:
        assert keys.detect_sd3(file_keys) == want == SPEC.main.detect(file_keys)


def test_detect_sd3_refuses_other_models(tiny):
    from library.models.families.flux import original_keys as flux_keys
    from tests.kits.flux.tiny import build_tiny_flux_components
    from tests.models.flux.test_flux_keys import sd_file_keys

    flux = build_tiny_flux_components("dev")["transformer"].state_dict()
    flux_original = flux_keys.transformer_to_original(flux)
    others = {
        "FLUX.1 original": flux_original,
        "FLUX.1 in a full checkpoint": [keys.ORIGINAL_PREFIX + k for k in flux_original],
        "FLUX.1 diffusers": flux,
        "SD 1.x": sd_file_keys("sd1"),
        "SDXL": sd_file_keys("sdxl"),
        "VAE": keys.ae_to_original(tiny["sd3-medium"]["vae"].state_dict()),
        "CLIP-G": tiny["sd3-medium"]["text_encoder_2"].state_dict(),
        "T5": tiny["sd3-medium"]["text_encoder_3"].state_dict(),
        "nothing": [],
    }
    from library.models.families.sd3.spec import SPEC

    for name, other in others.items():
        assert keys.detect_sd3(other) is None and SPEC.main.detect(other) is None, name
    # Nor does the FLUX.1 detection claim an SD3 file.
    for variant in shapes.VARIANTS:
        assert flux_keys.detect_flux(sd3_file_keys(tiny, variant, ("vae",))) is None
        assert flux_keys.detect_flux(transformer_state(tiny, variant)) is None


# --- configs from shapes ----------------------------------------------------------------------


@pytest.mark.parametrize("variant", shapes.VARIANTS)
def test_tiny_config_from_shapes(tiny, variant, caplog):
    state = transformer_state(tiny, variant)
    with caplog.at_level(logging.WARNING):
        config = keys.transformer_config_from_shapes({k: tuple(v.shape) for k, v in state.items()})
    want = tiny_shapes.tiny_transformer_config(variant)
    # Not in the weights: the default image size, capped by the position table (16 or 32 patches
    # of 2 latent pixels).
    assert config.pop("sample_size") == min(128, 2 * want["pos_embed_max_size"])
    want.pop("sample_size")
    if variant == "sd3-medium":
        # No qk norm: the head width does not show; 64 does not divide 32, so it is guessed.
        assert (config.pop("attention_head_dim"), config.pop("num_attention_heads")) == (32, 1)
        assert (want.pop("attention_head_dim"), want.pop("num_attention_heads")) == (16, 2)
        assert "guessed num_attention_heads=1" in caplog.text
    else:
        assert not caplog.text
    assert config == want
