"""FLUX.1 original (BFL) <-> diffusers names: round trips, diffusers' own single-file converters as
the reference, full-size key sets and parameter counts on the meta device, and file detection."""

from __future__ import annotations

import inspect

import pytest
import torch

from library.models.families.flux import original_keys as keys
from library.models.families.flux import shapes
from tests.kits.flux import tiny_shapes
from tests.kits.flux.tiny import build_tiny_flux_components


@pytest.fixture(scope="module")
def tiny():
    return {v: build_tiny_flux_components(v, seed=3) for v in shapes.VARIANTS}


def assert_same(got: dict, want: dict) -> None:
    assert set(got) == set(want)
    for key, value in want.items():
        assert got[key].shape == value.shape, key
        assert torch.equal(got[key], value), key


# --- hand-written names -----------------------------------------------------------------------

# From the BFL module definitions (sd-scripts library/flux_models.py) and diffusers'
# transformer_flux.py; one per kind of rename.
KNOWN = [
    ("img_in.weight", "x_embedder.weight"),
    ("time_in.out_layer.bias", "time_text_embed.timestep_embedder.linear_2.bias"),
    ("vector_in.in_layer.weight", "time_text_embed.text_embedder.linear_1.weight"),
    ("guidance_in.in_layer.bias", "time_text_embed.guidance_embedder.linear_1.bias"),
    ("double_blocks.1.txt_mod.lin.weight", "transformer_blocks.1.norm1_context.linear.weight"),
    ("double_blocks.0.txt_attn.norm.key_norm.scale", "transformer_blocks.0.attn.norm_added_k.weight"),
    ("double_blocks.1.img_attn.proj.bias", "transformer_blocks.1.attn.to_out.0.bias"),
    ("double_blocks.0.txt_mlp.2.weight", "transformer_blocks.0.ff_context.net.2.weight"),
    ("single_blocks.1.norm.query_norm.scale", "single_transformer_blocks.1.attn.norm_q.weight"),
    ("single_blocks.0.linear2.weight", "single_transformer_blocks.0.proj_out.weight"),
    ("final_layer.linear.bias", "proj_out.bias"),
]  # fmt: skip


def test_known_names(tiny):
    state = tiny["dev"]["transformer"].state_dict()
    original = keys.transformer_to_original(state)
    for old, new in KNOWN:
        assert torch.equal(original[old], state[new]), old


def test_fused_and_swapped_parts(tiny):
    """q|k|v and q|k|v|mlp are stacked in that order; the final modulation is (shift, scale)."""
    state = tiny["dev"]["transformer"].state_dict()
    original = keys.transformer_to_original(state)
    qkv = original["double_blocks.1.txt_attn.qkv.weight"]
    for i, name in enumerate(("add_q_proj", "add_k_proj", "add_v_proj")):
        assert torch.equal(qkv.chunk(3)[i], state[f"transformer_blocks.1.attn.{name}.weight"])
    width = tiny_shapes.TINY_HEADS * tiny_shapes.TINY_HEAD_DIM
    linear1 = original["single_blocks.0.linear1.bias"]
    assert linear1.shape == (7 * width,)  # 3 projections + the MLP's 4x width
    parts = ("attn.to_q", "attn.to_k", "attn.to_v", "proj_mlp")
    for part, piece in zip(parts, linear1.split([width] * 3 + [4 * width]), strict=True):
        assert torch.equal(piece, state[f"single_transformer_blocks.0.{part}.bias"])
    # diffusers' AdaLayerNormContinuous reads (scale, shift); BFL's LastLayer (shift, scale).
    shift, scale = original["final_layer.adaLN_modulation.1.weight"].chunk(2)
    assert torch.equal(torch.cat([scale, shift]), state["norm_out.linear.weight"])


# --- round trips and diffusers' converters ----------------------------------------------------


def test_unknown_and_incomplete_keys_fail(tiny):
    state = tiny["dev"]["transformer"].state_dict()
    with pytest.raises(ValueError, match="not a key"):
        keys.transformer_to_original({**state, "pos_embed.proj.weight": torch.zeros(1)})
    incomplete = {k: v for k, v in state.items() if k != "transformer_blocks.0.attn.to_k.weight"}
    with pytest.raises(ValueError, match="missing"):
        keys.transformer_to_original(incomplete)
    with pytest.raises(ValueError, match="not a key"):
        keys.transformer_from_original({"text_encoders.clip_l.foo": torch.zeros(1)})


# --- what the conformance suite does not know ------------------------------------------------
# (tests/conformance: the round trips, diffusers' converters and fp8 for every family)


@pytest.mark.parametrize("variant", shapes.VARIANTS)
def test_prefixed_keys_and_guidance(tiny, variant):
    """ComfyUI's prefixed keys read as bare ones; only dev has the guidance embedder."""
    state = tiny[variant]["transformer"].state_dict()
    original = keys.transformer_to_original(state)
    assert ("guidance_in.in_layer.weight" in original) == (variant == "dev")
    prefixed = {keys.ORIGINAL_PREFIX + k: v for k, v in original.items()}
    assert_same(keys.transformer_from_original(prefixed), state)


def test_ae_original_layout(tiny):
    original = keys.ae_to_original(tiny["dev"]["vae"].state_dict())
    assert not any(k.startswith(("quant_conv", "post_quant_conv")) for k in original)
    assert original["encoder.mid.attn_1.q.weight"].dim() == 4  # BFL's 1x1 convolutions


# --- full size, on the meta device ------------------------------------------------------------


def meta_transformer(variant: str):
    from diffusers import FluxTransformer2DModel

    with torch.device("meta"):
        return FluxTransformer2DModel(**shapes.transformer_config(variant))


def bfl_parameter_count(guidance: bool) -> int:
    """FLUX.1's parameter count from its architecture (BFL's flux/model.py, modules.layers)."""
    d, mlp, head, n_double, n_single = 3072, 4 * 3072, 128, 19, 38

    def linear(i, o):
        return i * o + o

    embed = linear(256, d) + linear(d, d)  # MLPEmbedder: timestep (and guidance) features
    top = linear(64, d) + linear(4096, d) + embed + linear(768, d) + linear(d, d)
    top += embed if guidance else 0
    top += linear(d, 64) + linear(d, 2 * d)  # final layer: linear, adaLN (shift, scale)
    stream = linear(d, 6 * d) + linear(d, 3 * d) + 2 * head + linear(d, d)  # mod, qkv, norms, proj
    stream += linear(d, mlp) + linear(mlp, d)
    single = linear(d, 3 * d) + linear(d, 3 * d + mlp) + linear(d + mlp, d) + 2 * head
    return top + n_double * 2 * stream + n_single * single


@pytest.mark.parametrize("variant", shapes.VARIANTS)
def test_full_size_transformer(variant):
    from diffusers.loaders.single_file_utils import convert_flux_transformer_checkpoint_to_diffusers

    model = meta_transformer(variant)
    state = model.state_dict()
    original = keys.transformer_to_original(state)
    # Per double block 2 streams x 12 (mod.lin, qkv, proj, mlp.0, mlp.2: weight + bias each;
    # query/key norm scales) = 24; per single block 8 (linear1, linear2, modulation.lin: weight +
    # bias; two norm scales); top level: img_in, txt_in, final_layer.linear, adaLN 2 each, and
    # the MLP embedders time_in, vector_in (and dev's guidance_in) 4 each.
    # dev: 19 * 24 + 38 * 8 + 20 = 780; schnell: 776.
    assert len(original) == (780 if variant == "dev" else 776)
    expected_shapes = {
        "img_in.weight": (3072, 64),
        "txt_in.weight": (3072, 4096),
        "vector_in.in_layer.weight": (3072, 768),
        "time_in.in_layer.weight": (3072, 256),
        "double_blocks.18.img_mod.lin.weight": (6 * 3072, 3072),
        "double_blocks.0.txt_attn.qkv.weight": (3 * 3072, 3072),
        "double_blocks.5.img_attn.norm.query_norm.scale": (128,),
        "single_blocks.37.linear1.weight": (7 * 3072, 3072),
        "single_blocks.0.linear2.weight": (3072, 5 * 3072),
        "single_blocks.0.modulation.lin.weight": (3 * 3072, 3072),
        "final_layer.adaLN_modulation.1.weight": (2 * 3072, 3072),
        "final_layer.linear.weight": (64, 3072),
    }
    for key, shape in expected_shapes.items():
        assert tuple(original[key].shape) == shape, key
    count = sum(v.numel() for v in original.values())
    assert count == bfl_parameter_count(variant == "dev")
    assert count == sum(p.numel() for p in model.parameters())
    if variant == "dev":
        assert 11.8e9 < count < 12.0e9  # published: "a 12 billion parameter" transformer

    checkpoint = dict(original)
    converted = convert_flux_transformer_checkpoint_to_diffusers(checkpoint)
    assert checkpoint == {}
    assert {k: v.shape for k, v in converted.items()} == {k: v.shape for k, v in state.items()}
    shape_list = {k: tuple(v.shape) for k, v in original.items()}
    back = keys.convert_shapes(keys.transformer_from_original, shape_list)
    assert back == {k: tuple(v.shape) for k, v in state.items()}
    assert keys.detect_flux(original) == keys.FluxKeys("original", variant, "", 19, 38)


def test_full_size_ae():
    from diffusers import AutoencoderKL
    from diffusers.loaders.single_file_utils import convert_ldm_vae_checkpoint

    with torch.device("meta"):
        state = AutoencoderKL(**shapes.ae_config()).state_dict()
    original = keys.ae_to_original(state)
    # Encoder: conv_in 2 + 4 levels x 2 ResNets x 8 + 2 nin_shortcuts x 2 (128->256, 256->512)
    # + 3 downsamplers x 2 + mid (2 ResNets x 8 + attention 10) + norm_out, conv_out 4 = 106.
    # Decoder: conv_in 2 + mid 26 + 4 levels x 3 ResNets x 8 + 2 shortcuts x 2 (512->256,
    # 256->128) + 3 upsamplers x 2 + norm_out, conv_out 4 = 138. ae.safetensors: 244 tensors.
    assert len(original) == 244
    assert tuple(original["encoder.conv_out.weight"].shape) == (32, 512, 3, 3)  # 2 x z_channels
    assert tuple(original["decoder.conv_in.weight"].shape) == (512, 16, 3, 3)
    assert tuple(original["decoder.up.0.block.0.nin_shortcut.weight"].shape) == (128, 256, 1, 1)
    assert tuple(original["encoder.mid.attn_1.proj_out.weight"].shape) == (512, 512, 1, 1)
    converted = convert_ldm_vae_checkpoint(dict(original), shapes.ae_config())
    assert {k: v.shape for k, v in converted.items()} == {k: v.shape for k, v in state.items()}


def test_transformer_config_is_diffusers_default():
    """diffusers' defaults are FLUX.1 dev's architecture, save the guidance embedding."""
    from diffusers import FluxTransformer2DModel

    params = inspect.signature(FluxTransformer2DModel.__init__).parameters
    for variant in shapes.VARIANTS:
        for name, value in shapes.transformer_config(variant).items():
            if name == "guidance_embeds":
                assert value == (variant == "dev")
            elif name == "axes_dims_rope":
                assert tuple(params[name].default) == value
            else:
                assert params[name].default == value, name


def test_full_size_text_encoders():
    from transformers import CLIPTextConfig, CLIPTextModel, T5Config, T5EncoderModel

    with torch.device("meta"):
        clip = CLIPTextModel(CLIPTextConfig(**shapes.clip_l_config()))
        t5 = T5EncoderModel(T5Config(**shapes.t5_xxl_config()))
    # CLIP ViT-L/14 text tower: token + position embeddings, 12 layers of 4 (768 x 768 + bias)
    # attention projections, a 768 -> 3072 -> 768 MLP and 2 LayerNorms; a final LayerNorm.
    d, ff = 768, 3072
    layer = 4 * (d * d + d) + d * ff + ff + ff * d + d + 2 * 2 * d
    assert sum(p.numel() for p in clip.parameters()) == 49408 * d + 77 * d + 12 * layer + 2 * d
    # T5 v1.1 XXL encoder: shared embedding, 24 layers of q, k, v, o (4096 x 4096, no bias),
    # a gated-GELU MLP (two 4096 -> 10240, one 10240 -> 4096) and 2 RMS norms; relative position
    # buckets (32 x 64 heads) in the first layer; a final norm. About 4.76 B parameters.
    d, ff = 4096, 10240
    layer = 4 * d * d + 3 * d * ff + 2 * d
    t5_count = sum(p.numel() for p in t5.parameters())
    assert t5_count == 32128 * d + 24 * layer + 32 * 64 + d
    assert 4.7e9 < t5_count < 4.8e9


# --- detection --------------------------------------------------------------------------------


def sd_file_keys(family: str) -> set[str]:
    """Key names of a tiny SD 1.x or SDXL single-file checkpoint, as the project writes them."""
    from library.models import original_names as names
    from tests.kits.sd.tiny import build_tiny_components

    parts = build_tiny_components(family)
    layout = names.UNetLayout.from_config(parts["unet"].config)
    out = {
        names.UNET_PREFIX + names.unet_path_to_original(k, layout)
        for k in parts["unet"].state_dict()
    }
    vae = names.vae_state_dict_to_original(parts["vae"].state_dict(), 2)
    out |= {names.VAE_PREFIX + k for k in vae}
    text = names.with_text_model_prefix(parts["text_encoder"].state_dict())
    head = (
        "conditioner.embedders.0.transformer."
        if family == "sdxl"
        else "cond_stage_model.transformer."
    )
    out |= {head + k for k in text}
    if family == "sdxl":
        second = names.with_text_model_prefix(parts["text_encoder_2"].state_dict())
        out |= {"conditioner.embedders.1.model." + k for k in names.openclip_from_hf(second)}
    return out


def test_detect_flux(tiny):
    for variant in shapes.VARIANTS:
        state = tiny[variant]["transformer"].state_dict()
        original = keys.transformer_to_original(state)
        assert keys.detect_flux(original) == keys.FluxKeys("original", variant, "", 2, 2)
        prefixed = [keys.ORIGINAL_PREFIX + k for k in original]
        found = keys.detect_flux(prefixed + ["vae.encoder.conv_in.weight"])
        assert found == keys.FluxKeys("original", variant, keys.ORIGINAL_PREFIX, 2, 2)
        assert keys.detect_flux(state) == keys.FluxKeys("diffusers", variant, "", 2, 2)
    for family in ("sd1", "sdxl"):
        assert keys.detect_flux(sd_file_keys(family)) is None
    assert keys.detect_flux(keys.ae_to_original(tiny["dev"]["vae"].state_dict())) is None
    assert keys.detect_flux(tiny["dev"]["text_encoder_2"].state_dict()) is None
    assert keys.detect_flux([]) is None
