"""Default LoRA targets, checked against an independent walk of the model and SD 1.5's counts."""

from __future__ import annotations

import torch
from torch import nn

from library.networks.targets import default_targets

_CONV_BLOCKS = ("ResnetBlock2D", "Downsample2D", "Upsample2D")


def _inside(model: nn.Module, class_names: tuple[str, ...]) -> dict[str, nn.Module]:
    """Linear/Conv2d layers below modules whose class name is one of ``class_names``."""
    found = {}
    for path, module in model.named_modules():
        if type(module).__name__ in class_names:
            for sub, layer in module.named_modules():
                if isinstance(layer, (nn.Linear, nn.Conv2d)):
                    found[f"{path}.{sub}"] = layer
    return found


def test_tiny_unet_attention_targets(unet):
    expected = {
        path
        for path, layer in _inside(unet, ("Transformer2DModel",)).items()
        if isinstance(layer, nn.Linear) or layer.kernel_size == (1, 1)
    }
    targets = default_targets(unet, "unet", conv=False)
    assert set(targets) == expected
    assert set(targets.values()) == {"linear"}
    # 4 transformer containers x (8 attention + 2 feed-forward + proj_in + proj_out)
    assert len(targets) == 4 * 12
    assert "down_blocks.0.attentions.0.transformer_blocks.0.attn2.to_out.0" in targets
    assert "mid_block.attentions.0.transformer_blocks.0.ff.net.0.proj" in targets


def test_tiny_unet_conv_targets(unet):
    targets = default_targets(unet, "unet", conv=True)
    attention = default_targets(unet, "unet", conv=False)
    extra = {p: k for p, k in targets.items() if p not in attention}
    expected = {
        path: "conv" if isinstance(layer, nn.Conv2d) and layer.kernel_size == (3, 3) else "linear"
        for path, layer in _inside(unet, _CONV_BLOCKS).items()
    }
    assert extra == expected
    assert extra["down_blocks.0.resnets.0.conv1"] == "conv"
    assert extra["down_blocks.0.downsamplers.0.conv"] == "conv"
    assert extra["up_blocks.0.upsamplers.0.conv"] == "conv"
    assert extra["down_blocks.1.resnets.0.conv_shortcut"] == "linear"
    assert extra["mid_block.resnets.1.time_emb_proj"] == "linear"
    for outside in ("conv_in", "conv_out", "time_embedding.linear_1"):
        assert outside not in targets


def test_text_encoder_targets(text_encoder):
    base = "text_model." if hasattr(text_encoder, "text_model") else ""
    names = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.out_proj")
    names += ("mlp.fc1", "mlp.fc2")
    expected = {f"{base}encoder.layers.{i}.{n}" for i in range(2) for n in names}
    targets = default_targets(text_encoder, "text_encoder", conv=True)
    assert set(targets) == expected
    assert set(targets.values()) == {"linear"}


def _sd15_unet_config() -> dict:
    """SD 1.5's unet/config.json, written out."""
    return {
        "sample_size": 64,
        "in_channels": 4,
        "out_channels": 4,
        "center_input_sample": False,
        "flip_sin_to_cos": True,
        "freq_shift": 0,
        "down_block_types": (
            "CrossAttnDownBlock2D",
            "CrossAttnDownBlock2D",
            "CrossAttnDownBlock2D",
            "DownBlock2D",
        ),
        "up_block_types": (
            "UpBlock2D",
            "CrossAttnUpBlock2D",
            "CrossAttnUpBlock2D",
            "CrossAttnUpBlock2D",
        ),
        "block_out_channels": (320, 640, 1280, 1280),
        "layers_per_block": 2,
        "downsample_padding": 1,
        "mid_block_scale_factor": 1,
        "act_fn": "silu",
        "norm_num_groups": 32,
        "norm_eps": 1e-5,
        "cross_attention_dim": 768,
        "attention_head_dim": 8,
    }


def test_sd15_unet_on_meta_has_192_targets():
    from diffusers import UNet2DConditionModel

    with torch.device("meta"):
        unet = UNet2DConditionModel(**_sd15_unet_config())
    assert next(unet.parameters()).device.type == "meta"
    targets = default_targets(unet, "unet", conv=False)
    assert len(targets) == 192
    conv = default_targets(unet, "unet", conv=True)
    # LoCon adds every Linear/Conv2d of the ResNet blocks and of the 3 down- and 3 upsamplers.
    resnets = list(_inside(unet, ("ResnetBlock2D",)))
    samplers = list(_inside(unet, ("Downsample2D", "Upsample2D")))
    assert len(samplers) == 6
    assert len(conv) == 192 + len(resnets) + len(samplers)


def test_clip_l_on_meta_has_72_targets():
    from transformers import CLIPTextConfig, CLIPTextModel

    config = CLIPTextConfig(
        vocab_size=49408,
        hidden_size=768,
        intermediate_size=3072,
        num_hidden_layers=12,
        num_attention_heads=12,
        max_position_embeddings=77,
        hidden_act="quick_gelu",
    )
    with torch.device("meta"):
        text_encoder = CLIPTextModel(config)
    assert len(default_targets(text_encoder, "text_encoder", conv=False)) == 72
