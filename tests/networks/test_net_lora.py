"""peft-injected LoRA: no-op when fresh, kohya's alpha / rank scale, float32 trainable adapters."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from library.networks.lora import (
    LoraSpec,
    apply_lora,
    lora_layers,
    lora_parameters,
    randomize_lora,
    set_lora_scale,
)
from library.networks.targets import default_targets


def test_fresh_adapter_is_a_no_op(unet, text_encoder, unet_inputs, token_ids, unet_out, text_out):
    unet_before = unet_out(unet, unet_inputs)
    text_before = text_out(text_encoder, token_ids)
    targets = default_targets(unet, "unet", conv=True)
    paths = apply_lora(unet, "unet", LoraSpec(4, 1.0, conv_dim=4, conv_alpha=2.0))
    assert paths == sorted(targets)
    apply_lora(text_encoder, "text_encoder", LoraSpec(4, 1.0))
    assert torch.equal(unet_out(unet, unet_inputs), unet_before)
    assert torch.equal(text_out(text_encoder, token_ids), text_before)


def test_adapter_wraps_the_layer_in_place(unet):
    original = unet.mid_block.attentions[0].transformer_blocks[0].attn1.to_q
    apply_lora(unet, "unet", LoraSpec(4, 4.0))
    wrapped = unet.mid_block.attentions[0].transformer_blocks[0].attn1.to_q
    assert wrapped.base_layer is original


def test_only_adapter_parameters_train(unet, unet_inputs):
    paths = apply_lora(unet, "unet", LoraSpec(4, 1.0, conv_dim=2))
    trainable = [p for p in unet.parameters() if p.requires_grad]
    params = lora_parameters(unet)
    assert len(params) == 2 * len(paths)
    assert {id(p) for p in trainable} == {id(p) for p in params}
    unet(*unet_inputs).sample.square().mean().backward()
    ups = [layer.lora_B["default"].weight for layer in lora_layers(unet).values()]
    assert all(w.grad is not None for w in ups)
    assert any(w.grad.abs().sum() > 0 for w in ups)
    assert all(p.grad is None for p in unet.parameters() if not p.requires_grad)


def test_adapter_is_float32_on_a_bf16_model(text_encoder, token_ids):
    text_encoder.to(torch.bfloat16)
    apply_lora(text_encoder, "text_encoder", LoraSpec(4, 1.0))
    assert {p.dtype for p in lora_parameters(text_encoder)} == {torch.float32}
    base = text_encoder.encoder.layers[0].self_attn.q_proj.base_layer
    assert base.weight.dtype == torch.bfloat16
    out = text_encoder(token_ids)[0]
    assert out.dtype == torch.bfloat16


def _randomized(model, kind, spec, seed=0):
    apply_lora(model, kind, spec)
    randomize_lora(model, torch.Generator().manual_seed(seed), std=0.2)
    return lora_layers(model)


def test_linear_scale_is_alpha_over_rank(text_encoder):
    layer = _randomized(text_encoder, "text_encoder", LoraSpec(4, 1.0))["encoder.layers.1.mlp.fc1"]
    x = torch.randn(3, 32)
    down, up = layer.lora_A["default"].weight, layer.lora_B["default"].weight
    base = layer.base_layer
    with torch.no_grad():
        expected = F.linear(x, base.weight, base.bias) + 0.25 * (x @ down.T @ up.T)
        assert torch.allclose(layer(x), expected, atol=1e-6)
        set_lora_scale(text_encoder, {"encoder.layers.1.mlp.fc1": 3.0})
        expected = F.linear(x, base.weight, base.bias) + 0.75 * (x @ down.T @ up.T)
        assert torch.allclose(layer(x), expected, atol=1e-6)


def test_conv_scale_uses_conv_rank_and_alpha(unet):
    spec = LoraSpec(8, 8.0, conv_dim=2, conv_alpha=1.0)
    layer = _randomized(unet, "unet", spec)["down_blocks.0.resnets.0.conv1"]
    down, up = layer.lora_A["default"].weight, layer.lora_B["default"].weight
    assert down.shape == (2, 32, 3, 3) and up.shape == (32, 2, 1, 1)
    x = torch.randn(1, 32, 8, 8)
    base = layer.base_layer
    with torch.no_grad():
        lora = F.conv2d(F.conv2d(x, down, padding=1), up)
        expected = F.conv2d(x, base.weight, base.bias, padding=1) + 0.5 * lora
        assert torch.allclose(layer(x), expected, atol=1e-5)


def test_conv_alpha_defaults_to_one_as_in_kohya(unet):
    # kohya's networks.lora sets conv_alpha = 1.0 when conv_dim is given without it
    layers = _randomized(unet, "unet", LoraSpec(4, 1.0, conv_dim=4))
    assert layers["down_blocks.0.resnets.0.conv1"].scaling["default"] == 0.25
    assert layers["down_blocks.0.attentions.0.proj_in"].scaling["default"] == 0.25


def test_applying_twice_is_refused(unet):
    apply_lora(unet, "unet", LoraSpec(4, 1.0))
    with pytest.raises(ValueError, match="already"):
        apply_lora(unet, "unet", LoraSpec(4, 1.0))


def test_set_lora_scale_rejects_unknown_paths(unet):
    apply_lora(unet, "unet", LoraSpec(4, 1.0))
    with pytest.raises(KeyError, match="conv_in"):
        set_lora_scale(unet, {"conv_in": 1.0})
