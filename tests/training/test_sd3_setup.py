"""SD3 LoRA setup: kohya's default targets on the MMDiT and the three text encoders, and the
choices refused by name before training (keys of other families, options not implemented)."""

from __future__ import annotations

import copy

import pytest
import torch
from sd3_fixtures import tiny_sd3_components

from library.config.flow_schema import FlowSection
from library.config.schema import Config, ModelSection
from library.errors import ConfigError
from library.models.families import registry
from library.models.families.family_choice import check_network_module
from library.models.families.sd3.lora_keys import T5, transformer_modules
from library.networks.fused_keys import target_paths, text_encoder_modules
from library.networks.lora import lora_layers
from library.training.setup import setup_training


def _config(flow=None, saving=None, **network):
    return Config(
        model={"pretrained_model_name_or_path": "unused"},
        network={"network_dim": 4, "network_alpha": 2.0, **network},
        optimizer={"learning_rate": 1e-4},
        flow=flow or {},
        saving=saving or {},
        datasets=[{"subsets": [{"image_dir": "unused"}]}],
    )


def test_lora_targets_every_kohya_module_and_t5_only_with_train_t5xxl():
    c = tiny_sd3_components()
    base = copy.deepcopy(c.denoiser)
    t5 = copy.deepcopy(c.text_encoders[2])
    parts = setup_training(_config(network_module="networks.lora_sd3"), c)
    assert sorted(lora_layers(c.denoiser)) == sorted(target_paths(transformer_modules(base)))
    assert [bool(lora_layers(e)) for e in c.text_encoders] == [True, True, False]
    assert [n for n, _ in parts.trained_modules()] == ["unet", "text_encoder", "text_encoder_2"]

    c = tiny_sd3_components(train_t5xxl=True)
    setup_training(_config(network_module="networks.lora_sd3", flow={"train_t5xxl": True}), c)
    assert sorted(lora_layers(c.text_encoders[2])) == sorted(
        target_paths(text_encoder_modules(t5, T5))
    )


@pytest.mark.parametrize(
    ("flow", "match"),
    [
        (
            {"timestep_sampling": "shift"},
            # every family that reads the key, as the registry lists them (FLUX.1 first)
            "timestep_sampling applies to Flux.1 and "
            + " and ".join(e.label for e in registry.flow_key_owners("timestep_sampling")[1:])
            + " models, not SD3",
        ),
        ({"guidance_scale": 1.0}, "guidance_scale applies to Flux.1"),
        ({"ae": "x"}, "ae applies to Flux.1"),
        ({"split_qkv": False}, "split_qkv=False"),
    ],
)
def test_options_of_other_families_or_kohyas_shared_qkv_are_refused_by_name(flow, match):
    c = tiny_sd3_components()
    with pytest.raises(ConfigError, match=match):
        c.family.check_options(ModelSection(pretrained_model_name_or_path="x"), FlowSection(**flow))
    # their off values change nothing and pass
    c.family.check_options(
        ModelSection(pretrained_model_name_or_path="x", clip_skip=1, max_token_length=75),
        FlowSection(split_qkv=True, training_shift=1.0),
    )


@pytest.mark.parametrize("family", ["sd3", "flux"])
def test_sd_settings_sd_scripts_ignores_on_flow_models_warn_and_load(family, caplog):
    """sd-scripts warns that max_token_length (and clip_skip, v_parameterization) are not used
    by its Flux.1 and SD3 trainers and trains; v2 = true names another model and stops."""
    from flux_fixtures import tiny_flux_components

    c = tiny_flux_components() if family == "flux" else tiny_sd3_components()
    model = ModelSection(
        pretrained_model_name_or_path="x", clip_skip=2, max_token_length=225, v_parameterization=True
    )
    with caplog.at_level("WARNING"):
        c.family.check_options(model, FlowSection())
    shown = "clip_skip = 2, max_token_length = 225, v_parameterization = true"
    assert f"{shown}: SD settings, not used by {c.family.LABEL}; ignored" in caplog.text
    with pytest.raises(ConfigError, match="v2 = true names an SD 2.x model"):
        c.family.check_options(ModelSection(pretrained_model_name_or_path="x", v2=True), FlowSection())


def test_sd3_keys_are_refused_on_flux():
    from flux_fixtures import tiny_flux_components

    c = tiny_flux_components()
    with pytest.raises(ConfigError, match="training_shift applies to SD3 models, not Flux.1"):
        c.family.check_options(
            ModelSection(pretrained_model_name_or_path="x"), FlowSection(training_shift=3.0)
        )


@pytest.mark.parametrize(
    ("keys", "match"),
    [
        ({"network_module": "networks.lora_flux"}, '"networks.lora_flux" is for Flux.1'),
        ({"conv_dim": 4}, "conv_dim: SD3's transformer has no convolutions"),
        (
            {"network_train_unet_only": False, "flow": {"train_t5xxl": True},
             "saving": {"lora_format": "diffusers"}},
            'lora_format = "diffusers" has no place for T5 adapters',
        ),
    ],
)  # fmt: skip
def test_training_choices_refused_before_training(keys, match):
    c = tiny_sd3_components()
    config = _config(**keys)
    with pytest.raises(ConfigError, match=match):  # as setup_training checks them
        check_network_module(c.family, config.network.network_module)
        c.family.check_training(config)


def test_diffusers_layout_is_refused_where_diffusers_converts_kohya_files():
    from flux_fixtures import tiny_flux_components

    c = tiny_flux_components()
    with pytest.raises(ConfigError, match='lora_format = "diffusers": flux-dev LoRA files'):
        c.family.check_training(_config(saving={"lora_format": "diffusers"}))


def test_describe_names_the_variant_and_its_text_settings():
    c = tiny_sd3_components("sd3.5-large", apply_lg_attn_mask=True, t5xxl_max_token_length=77,
                            t5_dropout_rate=0.1)  # fmt: skip
    assert c.family.describe() == (
        "SD3.5 Large (77 T5 tokens, CLIP padding masked, T5 dropout 0.1)"
    )
    assert c.family.text_cache_name == "sd3.5-large|t5_tokens=77|clip_mask"
    assert "training_shift 1" in c.objective.describe()


def test_masked_clip_padding_changes_the_text_and_the_cache_key():
    """apply_lg_attn_mask: CLIP-L and CLIP-G ignore the caption's padding, so their states differ
    from the unmasked ones (the MMDiT itself attends to every token, as in sd-scripts)."""
    plain = tiny_sd3_components()
    masked = tiny_sd3_components(apply_lg_attn_mask=True)
    captions = ["a red circle"]
    with torch.no_grad():
        a = plain.family.encode_text(plain.tokenizers, plain.text_encoders, captions, "cpu")
        b = masked.family.encode_text(masked.tokenizers, masked.text_encoders, captions, "cpu")
    width = sum(e.config.hidden_size for e in plain.text_encoders[:2])
    assert not torch.allclose(a.hidden[:, :77, :width], b.hidden[:, :77, :width])
    torch.testing.assert_close(a.hidden[:, 77:], b.hidden[:, 77:])  # T5 unmasked in both
    assert plain.family.text_cache_name != masked.family.text_cache_name
