"""Merging an exported file into a plain model reproduces the adapter's output."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from library.errors import CheckpointError
from library.networks.kohya_keys import export_lora
from library.networks.lora import LoraSpec, apply_lora, randomize_lora
from tests.networks.lora_merge import merge_lora_file


def _adapt(model, kind, spec, seed):
    apply_lora(model, kind, spec)
    randomize_lora(model, torch.Generator().manual_seed(seed), std=0.1)
    return model


@pytest.mark.parametrize("conv", [False, True])
def test_merged_unet_matches_adapter(unet, unet_inputs, unet_out, conv):
    plain = copy.deepcopy(unet)
    before = unet_out(plain, unet_inputs)
    spec = LoraSpec(4, 1.0, conv_dim=2 if conv else None, conv_alpha=3.0 if conv else None)
    adapted = _adapt(unet, "unet", spec, seed=4)
    tensors = export_lora({"lora_unet": adapted})
    merged = merge_lora_file(plain, tensors, "lora_unet")
    assert merged == len(tensors) // 3
    expected = unet_out(adapted, unet_inputs)
    assert (expected - before).abs().max() > 1e-2  # the adapter does something
    torch.testing.assert_close(unet_out(plain, unet_inputs), expected, rtol=1e-4, atol=1e-5)


def test_merged_text_encoder_matches_adapter(text_encoder, token_ids, text_out):
    plain = copy.deepcopy(text_encoder)
    adapted = _adapt(text_encoder, "text_encoder", LoraSpec(4, 1.0), seed=5)
    tensors = export_lora({"lora_te": adapted})
    # a UNet prefix in the same file is left alone
    assert merge_lora_file(plain, tensors, "lora_unet") == 0
    assert merge_lora_file(plain, tensors, "lora_te") == 12
    torch.testing.assert_close(
        text_out(plain, token_ids), text_out(adapted, token_ids), rtol=1e-4, atol=1e-5
    )


def test_merge_of_one_linear_by_hand():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 5))
    down, up = torch.randn(3, 6), torch.randn(5, 3)
    expected = model[0].weight.detach() + 0.5 * (2.0 / 3) * sum(
        torch.outer(up[:, k], down[k]) for k in range(3)
    )
    tensors = {
        "x_0.lora_down.weight": down,
        "x_0.lora_up.weight": up,
        "x_0.alpha": torch.tensor(2.0),
    }
    assert merge_lora_file(model, tensors, "x", multiplier=0.5) == 1
    torch.testing.assert_close(model[0].weight.detach(), expected)


def test_merge_names_unknown_modules():
    model = nn.Sequential(nn.Linear(6, 5))
    tensors = {"x_9.lora_down.weight": torch.zeros(1, 6), "x_9.lora_up.weight": torch.zeros(5, 1)}
    with pytest.raises(CheckpointError, match="x_9"):
        merge_lora_file(model, tensors, "x")
