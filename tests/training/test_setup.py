"""What is trained, in which dtype, with which learning rate."""

import pytest
import torch

from library.config.schema import Config
from library.models.families import registry
from library.models.loader import load_components
from library.training.setup import setup_training


def _config(model_dir, **network):
    training = network.pop("training", {})
    return Config(
        model={"pretrained_model_name_or_path": str(model_dir)},
        network=network,
        optimizer={"learning_rate": 1e-4},
        training=training,
        datasets=[{"subsets": [{"image_dir": "unused"}]}],
    )


def _dtypes(module, trainable):
    return {p.dtype for p in module.parameters() if p.requires_grad == trainable}


def test_lora_trains_fp32_adapters_on_bf16_frozen_models(tiny_model_dir):
    config = _config(
        tiny_model_dir,
        unet_lr=3e-4,
        text_encoder_lr=5e-5,
        training={"gradient_checkpointing": True},
    )
    parts = setup_training(config, load_components(config.model, torch.bfloat16))
    unet, te, vae = parts.components.denoiser, parts.components.text_encoder, parts.components.vae
    assert _dtypes(unet, True) == {torch.float32} and _dtypes(unet, False) == {torch.bfloat16}
    assert _dtypes(te, True) == {torch.float32} and _dtypes(te, False) == {torch.bfloat16}
    assert _dtypes(vae, True) == set() and _dtypes(vae, False) == {torch.bfloat16}
    assert [(g["name"], g["lr"]) for g in parts.param_groups] == [
        ("unet", 3e-4),
        ("text_encoder", 5e-5),
    ]
    trained = {id(p) for p in parts.parameters()}
    all_grad = {id(p) for m in (unet, te) for p in m.parameters() if p.requires_grad}
    assert trained == all_grad and all(("lora_" in k) for k in parts.trained_weights())
    assert unet.is_gradient_checkpointing and te.is_gradient_checkpointing


@pytest.mark.parametrize(
    "network,unet_trained,te_trained",
    [
        ({"network_train_unet_only": True}, True, False),
        ({"network_train_text_encoder_only": True}, False, True),
    ],
)
def test_one_side_only(tiny_model_dir, network, unet_trained, te_trained):
    config = _config(tiny_model_dir, **network)
    parts = setup_training(config, load_components(config.model, torch.float32))
    assert any(p.requires_grad for p in parts.components.denoiser.parameters()) == unet_trained
    assert any(p.requires_grad for p in parts.components.text_encoder.parameters()) == te_trained
    assert [n for n, _ in parts.trained_modules()] == (
        ["unet"] if unet_trained else ["text_encoder"]
    )


def test_full_unet_trains_every_unet_weight_in_fp32(tiny_model_dir):
    config = _config(tiny_model_dir, train_mode="unet")
    parts = setup_training(config, load_components(config.model, torch.bfloat16))
    unet = parts.components.denoiser
    assert all(p.requires_grad and p.dtype == torch.float32 for p in unet.parameters())
    assert not any(p.requires_grad for p in parts.components.text_encoder.parameters())
    assert len(parts.parameters()) == len(list(unet.parameters()))


def test_network_weights_with_full_unet_is_refused(tiny_model_dir):
    with pytest.raises(ValueError, match="network_weights starts a LoRA"):
        _config(tiny_model_dir, train_mode="unet", network_weights="x.safetensors")


@pytest.mark.parametrize("train_mode", ["lora", "unet"])
def test_full_bf16_keeps_trained_weights_in_bf16(tiny_model_dir, train_mode):
    config = _config(
        tiny_model_dir,
        train_mode=train_mode,
        training={"mixed_precision": "bf16", "full_bf16": True},
    )
    parts = setup_training(config, load_components(config.model, torch.bfloat16))
    assert {p.dtype for p in parts.parameters()} == {torch.bfloat16}
    assert {t.dtype for t in parts.trained_weights().values()} == {torch.bfloat16}


def test_full_half_needs_its_mixed_precision(tiny_model_dir):
    with pytest.raises(ValueError, match='full_bf16 = true needs mixed_precision = "bf16"'):
        _config(tiny_model_dir, training={"full_bf16": True})
    with pytest.raises(ValueError, match='full_fp16 = true needs mixed_precision = "fp16"'):
        _config(tiny_model_dir, training={"mixed_precision": "bf16", "full_fp16": True})


def test_text_encoder_lr_list_gives_one_rate_per_encoder(tiny_sdxl_model_dir):
    config = _config(tiny_sdxl_model_dir, text_encoder_lr=[1e-5, 2e-5], unet_lr=3e-4)
    parts = setup_training(config, load_components(config.model, torch.float32))
    rates = {g["name"]: g["lr"] for g in parts.param_groups}
    assert rates == {"unet": 3e-4, "text_encoder": 1e-5, "text_encoder_2": 2e-5}
    short = _config(tiny_sdxl_model_dir, text_encoder_lr=[4e-5])  # kohya repeats the last one
    parts = setup_training(short, load_components(short.model, torch.float32))
    assert [g["lr"] for g in parts.param_groups if g["name"] != "unet"] == [4e-5, 4e-5]


def test_text_encoder_lr_list_longer_than_the_encoders_uses_the_first_rates(tiny_model_dir):
    """As sd-scripts: the kohya_ss GUI writes two rates for SD 1.5's one text encoder."""
    config = _config(tiny_model_dir, text_encoder_lr=[1e-5, 2e-5])
    parts = setup_training(config, load_components(config.model, torch.float32))
    assert [g["lr"] for g in parts.param_groups if g["name"] != "unet"] == [1e-5]


def test_flux_keys_are_refused_on_an_sd_model(tiny_model_dir):
    """[flow] keys and networks.lora_flux would change nothing on an SD model: refused by name."""
    from library.config.flow_schema import FlowSection
    from library.errors import ConfigError

    model = _config(tiny_model_dir).model
    with pytest.raises(
        ConfigError,
        # every family that reads the key, as the registry lists them
        match="timestep_sampling is a "
        + " or ".join(e.models for e in registry.flow_key_owners("timestep_sampling"))
        + " key, and ",
    ):
        load_components(model, torch.float32, FlowSection(timestep_sampling="shift"))
    config = _config(tiny_model_dir, network_module="networks.lora_flux")
    with pytest.raises(ConfigError, match='"networks.lora_flux" is for Flux.1'):
        setup_training(config, load_components(config.model, torch.float32))
