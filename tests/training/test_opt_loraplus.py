"""LoRA+: the up (B) weights get their own group at lr x ratio, per model."""

import pytest
import torch
from pydantic import ValidationError

from library.config.schema import Config
from library.models.loader import load_components
from library.training.optimizers import build_optimizer
from library.training.setup import setup_training


def _parts(model_dir, network=None, **optimizer):
    config = Config(
        model={"pretrained_model_name_or_path": str(model_dir)},
        network=network or {},
        optimizer={"learning_rate": 1e-4, **optimizer},
        datasets=[{"subsets": [{"image_dir": "unused"}]}],
    )
    return config, setup_training(config, load_components(config.model, torch.float32))


def _by_name(model):
    """Every LoRA weight of the model by whether its parameter path says down (lora_A) or up."""
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    down = {id(p) for n, p in named if ".lora_A." in n}
    up = {id(p) for n, p in named if ".lora_B." in n}
    assert down and up and len(down) + len(up) == len(named)
    return down, up


def test_ratios_split_each_model_into_down_and_up_groups(tiny_model_dir):
    _, parts = _parts(
        tiny_model_dir,
        {"unet_lr": 2e-4, "text_encoder_lr": 5e-5},
        loraplus_lr_ratio=16.0,
        loraplus_text_encoder_lr_ratio=4.0,
    )
    groups = {g["name"]: g for g in parts.param_groups}
    assert [g["name"] for g in parts.param_groups] == [
        "unet",
        "unet_up",
        "text_encoder",
        "text_encoder_up",
    ]
    assert groups["unet"]["lr"] == 2e-4 and groups["unet_up"]["lr"] == pytest.approx(2e-4 * 16)
    assert groups["text_encoder"]["lr"] == 5e-5 and groups["text_encoder_up"][
        "lr"
    ] == pytest.approx(5e-5 * 4)
    for model, name in (
        (parts.components.denoiser, "unet"),
        (parts.components.text_encoder, "text_encoder"),
    ):
        down, up = _by_name(model)
        assert {id(p) for p in groups[name]["params"]} == down
        assert {id(p) for p in groups[f"{name}_up"]["params"]} == up


def test_up_weights_move_ratio_times_faster_with_sgd(tiny_model_dir):
    config, parts = _parts(
        tiny_model_dir,
        {"network_train_unet_only": True},
        loraplus_unet_lr_ratio=8.0,
        optimizer_type="torch.optim.SGD",
    )
    opt = build_optimizer(config.optimizer, parts.param_groups)
    params = parts.parameters()
    before = [p.detach().clone() for p in params]
    for p in params:
        p.grad = torch.ones_like(p)
    opt.step()
    down, up = _by_name(parts.components.denoiser)
    for p, b in zip(params, before, strict=True):
        expected = 1e-4 * (8.0 if id(p) in up else 1.0)
        assert torch.allclose(b - p.detach(), torch.full_like(b, expected)), id(p) in down


def test_no_ratio_keeps_one_group_per_model(tiny_model_dir):
    _, parts = _parts(tiny_model_dir)
    assert [g["name"] for g in parts.param_groups] == ["unet", "text_encoder"]


def test_loraplus_with_full_unet_training_is_refused(tiny_model_dir):
    # by the config itself, before any weight is read (tests/config/test_config_cross_rules.py)
    with pytest.raises(
        ValidationError, match='loraplus_lr_ratio is for LoRA up/down weights; with train_mode = "unet"'
    ):
        _parts(tiny_model_dir, {"train_mode": "unet"}, loraplus_lr_ratio=16.0)
