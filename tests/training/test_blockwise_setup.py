"""kohya's block-wise networks.lora options applied to a UNet: each block's rank and alpha, no
adapters in blocks whose learning-rate weight is 0, and one parameter group per block rate.
Block numbers come from library/models/families/sd/blocks.py, whose own tests count them
independently."""

from __future__ import annotations

import pytest
import torch

from library.config.schema import Config
from library.errors import ConfigError
from library.models.families.registry import unet_key_layout
from library.models.families.sd.blocks import block_index
from library.models.loader import load_components
from library.networks.kohya_names import UNET, kohya_name, kohya_path
from library.networks.lora import lora_alpha, lora_layers, lora_rank
from library.networks.targets import default_targets
from library.training.setup import setup_training

LR = 1e-3


def _parts(model_dir, **adapter):
    config = Config(
        model={"pretrained_model_name_or_path": str(model_dir)},
        network={"network_dim": 4, "network_alpha": 2.0, "network_train_unet_only": True},
        optimizer={"learning_rate": LR},
        adapter=adapter,
        datasets=[{"subsets": [{"image_dir": "unused"}]}],
    )
    return setup_training(config, load_components(config.model, torch.float32))


def _plain_targets(model_dir) -> list[str]:
    """What a plain LoRA adapts in a fresh copy of the model."""
    unet = load_components(Config(
        model={"pretrained_model_name_or_path": str(model_dir)},
        datasets=[{"subsets": [{"image_dir": "unused"}]}],
    ).model, torch.float32).denoiser  # fmt: skip
    return sorted(default_targets(unet, "unet", conv=False))


def _blocks(unet, sdxl: bool) -> dict[str, int]:
    return {
        path: block_index(kohya_name(UNET, kohya_path(unet, path, unet_key_layout)), sdxl)
        for path in lora_layers(unet)
    }


def test_each_block_gets_its_rank_and_alpha(tiny_model_dir):
    dims = [1 + i % 5 for i in range(25)]
    alphas = [0.5 * (1 + i % 3) for i in range(25)]
    parts = _parts(tiny_model_dir, block_dims=dims, block_alphas=alphas)
    unet = parts.components.denoiser
    blocks = _blocks(unet, sdxl=False)
    assert len(set(blocks.values())) >= 4  # several blocks, so a mix-up would show
    for path, index in blocks.items():
        layer = lora_layers(unet)[path]
        assert (lora_rank(layer), lora_alpha(layer)) == (dims[index], alphas[index]), path
    # same layers as a plain LoRA: block ranks change ranks, not targets
    assert sorted(blocks) == _plain_targets(tiny_model_dir)


def test_zero_weight_blocks_lose_their_adapters_and_rates_follow_blocks(tiny_model_dir):
    up = [1.0, 1.0, 1.0, 0.0, 2.0, 1.0] + [1.5] * 6  # block 16 off, block 17 at 2x
    parts = _parts(tiny_model_dir, down_lr_weight="zeros+0.5", mid_lr_weight=3.0, up_lr_weight=up)
    unet = parts.components.denoiser
    blocks = _blocks(unet, sdxl=False)
    all_targets = _plain_targets(tiny_model_dir)
    gone = {
        p for p in all_targets
        if block_index(kohya_name(UNET, kohya_path(unet, p, unet_key_layout)), False) == 16
    }  # fmt: skip
    assert gone and sorted(blocks) == sorted(set(all_targets) - gone)
    assert 17 in blocks.values()
    expected = {i: 0.5 if i < 12 else 3.0 if i == 12 else up[i - 13] for i in range(25)}
    rates = {g["name"]: g["lr"] for g in parts.param_groups}
    assert rates == {f"unet_block{i}": LR * expected[i] for i in sorted(set(blocks.values()))}
    # every adapter parameter is in the group of its block
    by_param = {id(p): g["name"] for g in parts.param_groups for p in g["params"]}
    for path, index in blocks.items():
        layer = lora_layers(unet)[path]
        for param in (*layer.lora_A.parameters(), *layer.lora_B.parameters()):
            assert by_param[id(param)] == f"unet_block{index}"


def test_sdxl_blocks_use_sgm_numbers(tiny_sdxl_model_dir):
    dims = [2 + i % 3 for i in range(23)]
    parts = _parts(tiny_sdxl_model_dir, block_dims=dims)
    unet = parts.components.denoiser
    for path, index in _blocks(unet, sdxl=True).items():
        assert lora_rank(lora_layers(unet)[path]) == dims[index], path


def test_wrong_lengths_are_refused_before_training(tiny_model_dir):
    with pytest.raises(ConfigError, match="block_dims"):
        _parts(tiny_model_dir, block_dims=[4] * 23)  # an SDXL list on an SD 1.x model
