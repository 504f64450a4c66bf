"""Diffusers <-> original names, checked against hand-written names and diffusers' converters."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from library.models import original_names as names
from tests.kits.sd.tiny import tiny_text_config, tiny_vae_config

CONFIGS = Path(__file__).parents[2] / "library" / "models" / "configs"


def shipped(folder: str, name: str) -> dict:
    return json.loads((CONFIGS / folder / f"{name}.json").read_text())


def meta_unet(config: dict):
    from diffusers import UNet2DConditionModel

    with torch.device("meta"):
        return UNet2DConditionModel.from_config(config)


# Names as A1111/ComfyUI/kohya write them (docs/formats.md, LoRA files: the SGM/LDM layout).
SDXL_NAMES = [
    ("down_blocks.1.attentions.0.transformer_blocks.0.attn2.to_k", "input_blocks.4.1.transformer_blocks.0.attn2.to_k"),
    ("down_blocks.2.attentions.1.transformer_blocks.9.ff.net.2", "input_blocks.8.1.transformer_blocks.9.ff.net.2"),
    ("mid_block.attentions.0.proj_in", "middle_block.1.proj_in"),
    ("up_blocks.0.attentions.0.transformer_blocks.3.attn1.to_out.0", "output_blocks.0.1.transformer_blocks.3.attn1.to_out.0"),
    ("down_blocks.0.resnets.1.conv1", "input_blocks.2.0.in_layers.2"),
    ("down_blocks.0.downsamplers.0.conv", "input_blocks.3.0.op"),
    ("up_blocks.1.upsamplers.0.conv", "output_blocks.5.2.conv"),
    ("up_blocks.2.resnets.0.conv_shortcut", "output_blocks.6.0.skip_connection"),
    ("mid_block.resnets.1.time_emb_proj", "middle_block.2.emb_layers.1"),
    ("add_embedding.linear_2.weight", "label_emb.0.2.weight"),
    ("time_embedding.linear_1.bias", "time_embed.0.bias"),
    ("conv_norm_out.weight", "out.0.weight"),
]  # fmt: skip
SD15_NAMES = [
    ("down_blocks.0.attentions.1.proj_out", "input_blocks.2.1.proj_out"),
    ("up_blocks.3.attentions.2.proj_out", "output_blocks.11.1.proj_out"),
    ("up_blocks.0.upsamplers.0.conv", "output_blocks.2.1.conv"),
    ("up_blocks.1.upsamplers.0.conv", "output_blocks.5.2.conv"),
    ("down_blocks.3.resnets.1.norm2.weight", "input_blocks.11.0.out_layers.0.weight"),
    ("conv_in.weight", "input_blocks.0.0.weight"),
    ("conv_out.bias", "out.2.bias"),
]  # fmt: skip


@pytest.mark.parametrize(("folder", "table"), [("sdxl-base", SDXL_NAMES), ("sd15", SD15_NAMES)])
def test_known_names_both_ways(folder, table):
    config = shipped(folder, "unet")
    for diffusers_name, original in table:
        assert names.unet_path_to_original(diffusers_name, config) == original
        assert names.unet_path_from_original(original, config) == diffusers_name


@pytest.mark.parametrize("folder", ["sd15", "sd2-512", "sdxl-base"])
def test_unet_names_agree_with_diffusers_converter(folder):
    """Every key, to original names and back; diffusers' own converter places each the same."""
    from diffusers.loaders.single_file_utils import convert_ldm_unet_checkpoint

    config = shipped(folder, "unet")
    keys = list(meta_unet(config).state_dict())
    original = {names.UNET_PREFIX + names.unet_path_to_original(k, config): k for k in keys}
    assert len(original) == len(keys)
    back = [names.unet_path_from_original(k[len(names.UNET_PREFIX) :], config) for k in original]
    assert back == keys
    # Each value is the index of its diffusers key; the converter must move it to that key.
    marked = {o: torch.tensor([i]) for i, o in enumerate(original)}
    converted = convert_ldm_unet_checkpoint(marked, config)
    assert {k: int(v) for k, v in converted.items()} == {k: i for i, k in enumerate(keys)}


@pytest.mark.parametrize(
    "path",
    ["down_blocks.0", "mid_block", "up_blocks.1.resnets", "down_blocks.3.downsamplers.0.conv"],
)
def test_paths_without_original_name_raise(path):
    config = shipped("sd15", "unet")
    if path.startswith("down_blocks.3.downsamplers"):
        # The last level has no downsampler: its would-be original name is no SD 1.5 module.
        original = names.unet_path_to_original(path, config)
        with pytest.raises(ValueError):
            names.unet_path_from_original(original, config)
        return
    with pytest.raises(ValueError):
        names.unet_path_to_original(path, config)


def test_vae_keys_and_attention_shapes_agree_with_diffusers_converter():
    from diffusers import AutoencoderKL
    from diffusers.loaders.single_file_utils import convert_ldm_vae_checkpoint

    torch.manual_seed(0)
    vae = AutoencoderKL(**tiny_vae_config())
    state = vae.state_dict()
    original = names.vae_state_dict_to_original(state, 4)
    # Hand-written facts of the original layout: 1x1-conv attention, mirrored decoder levels,
    # nin_shortcut where the width changes (8 -> 16 at encoder level 2).
    q = state["encoder.mid_block.attentions.0.to_q.weight"]
    assert torch.equal(original["encoder.mid.attn_1.q.weight"], q[:, :, None, None])
    assert torch.equal(
        original["decoder.up.3.upsample.conv.weight"],
        state["decoder.up_blocks.0.upsamplers.0.conv.weight"],
    )
    assert torch.equal(
        original["encoder.down.2.block.0.nin_shortcut.weight"],
        state["encoder.down_blocks.2.resnets.0.conv_shortcut.weight"],
    )
    assert torch.equal(original["encoder.norm_out.weight"], state["encoder.conv_norm_out.weight"])
    converted = convert_ldm_vae_checkpoint(
        {names.VAE_PREFIX + k: v for k, v in original.items()}, tiny_vae_config()
    )
    assert converted.keys() == state.keys()
    assert all(torch.equal(converted[k], state[k]) for k in state)
    back = names.vae_state_dict_from_original(original, 4)
    assert back.keys() == state.keys()
    assert all(torch.equal(back[k], state[k]) for k in state)


def test_openclip_layout_agrees_with_diffusers_converter():
    from diffusers.loaders.single_file_utils import convert_open_clip_checkpoint
    from transformers import CLIPTextConfig, CLIPTextModelWithProjection

    torch.manual_seed(0)
    model = CLIPTextModelWithProjection(
        CLIPTextConfig(**tiny_text_config("sd2"), projection_dim=16)
    )
    state = model.state_dict()
    openclip = names.openclip_from_hf(state)
    q = state["text_model.encoder.layers.1.self_attn.q_proj.weight"]
    v = state["text_model.encoder.layers.1.self_attn.v_proj.weight"]
    fused = openclip["transformer.resblocks.1.attn.in_proj_weight"]
    assert fused.shape == (96, 32) and torch.equal(fused[:32], q) and torch.equal(fused[64:], v)
    assert openclip["text_projection"].shape == (32, 16)  # [width, embed] in OpenCLIP
    fc1 = state["text_model.encoder.layers.0.mlp.fc1.weight"]
    assert torch.equal(openclip["transformer.resblocks.0.mlp.c_fc.weight"], fc1)
    prefix = "conditioner.embedders.1.model."
    converted = convert_open_clip_checkpoint(
        model, {prefix + k: t for k, t in openclip.items()}, prefix=prefix
    )
    assert converted.keys() == state.keys()
    assert all(torch.equal(converted[k], state[k]) for k in state)
    back = names.hf_from_openclip(openclip)
    assert back.keys() == state.keys()
    assert all(torch.equal(back[k], state[k]) for k in state)


def test_text_model_prefix_both_layouts():
    from transformers import CLIPTextConfig, CLIPTextModel

    model = CLIPTextModel(CLIPTextConfig(**tiny_text_config("sd1")))
    prefixed = names.with_text_model_prefix(model.state_dict())
    assert all(k.startswith("text_model.") for k in prefixed)
    assert "text_model.final_layer_norm.weight" in prefixed
    assert names.with_text_model_prefix(prefixed).keys() == prefixed.keys()
    assert names.fit_text_model_prefix(prefixed, model).keys() == model.state_dict().keys()
