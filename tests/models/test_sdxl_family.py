"""SDXL as family data: its fields, detection, the tiny SDXL folder, and LoRA metadata."""

from __future__ import annotations

import logging

import pytest
import torch

from library.config.schema import Config, ModelSection, SavingSection
from library.models.families.sd.family import (
    SD1,
    SDXL,
    SDXL_V,
    detect_family,
    is_sdxl_unet,
    unet_lora_key_layout,
)
from library.saving.metadata import RunInfo, lora_metadata, unet_metadata

SDXL_UNET = {"addition_embed_type": "text_time", "cross_attention_dim": 2048}
EPS = {"prediction_type": "epsilon"}
V = {"prediction_type": "v_prediction"}


@pytest.fixture(scope="module")
def sdxl_dir(tiny_sdxl_model_dir):
    return tiny_sdxl_model_dir


def section(path: str = "unused", **flags) -> ModelSection:
    return ModelSection(pretrained_model_name_or_path=path, **flags)


def test_sdxl_fields_are_the_published_values():
    # docs/formats.md (LoRA files) and the SDXL 1.0 release, written out.
    assert SDXL.name == "sdxl"
    assert SDXL.base_model_version == "sdxl_base_v1-0"
    assert SDXL.modelspec_architecture == "stable-diffusion-xl-v1-base"
    assert SDXL.lora_architecture == "stable-diffusion-xl-v1-base/lora"
    assert SDXL.text_encoder_subfolders == ("text_encoder", "text_encoder_2")
    assert SDXL.tokenizer_subfolders == ("tokenizer", "tokenizer_2")
    assert SDXL.text_encoder_lora_prefixes == ("lora_te1", "lora_te2")
    assert SDXL.unet_lora_prefix == "lora_unet_"
    assert SDXL.uses_pooled_text_embedding and SDXL.uses_size_conditioning
    assert SDXL.text_layer == "penultimate"
    assert SDXL.unet_lora_key_layout == "original"
    assert SDXL.latent_scale == 0.13025
    assert SDXL.default_resolution == 1024
    assert not SDXL.v2 and SDXL.prediction_type == "epsilon"
    assert SDXL_V.prediction_type == "v_prediction" and SDXL_V.modelspec_prediction_type == "v"
    assert SDXL_V.base_model_version == SDXL.base_model_version
    # SD 1.x keeps its single encoder, diffusers names and last layer.
    assert (SD1.text_layer, SD1.unet_lora_key_layout, SD1.latent_scale) == (
        "last",
        "diffusers",
        0.18215,
    )
    assert not SD1.uses_pooled_text_embedding and not SD1.uses_size_conditioning


@pytest.mark.parametrize(
    ("unet", "index", "sched", "flags", "expected"),
    [
        (SDXL_UNET, None, EPS, {}, SDXL),
        (SDXL_UNET, None, V, {}, SDXL_V),
        (SDXL_UNET, None, EPS, {"v_parameterization": True}, SDXL_V),
        (SDXL_UNET, None, V, {"v_parameterization": False}, SDXL),
        # The pipeline class alone is enough (a UNet config without the marker).
        (
            {"cross_attention_dim": 2048},
            {"_class_name": "StableDiffusionXLPipeline"},
            EPS,
            {},
            SDXL,
        ),
        # SD 1.x stays SD 1.x with an SD pipeline index.
        ({"cross_attention_dim": 768}, {"_class_name": "StableDiffusionPipeline"}, EPS, {}, SD1),
    ],
)
def test_detect_sdxl(unet, index, sched, flags, expected):
    assert detect_family(section(**flags), unet, sched, index) == expected


def test_v2_flag_does_not_turn_sdxl_into_sd2(caplog):
    with caplog.at_level(logging.WARNING):
        assert detect_family(section(v2=True), SDXL_UNET, EPS) is SDXL
    assert "SDXL" in caplog.text


def test_unet_key_layout_follows_the_unet():
    assert is_sdxl_unet(SDXL_UNET) and not is_sdxl_unet({"cross_attention_dim": 768})
    assert unet_lora_key_layout(SDXL_UNET) == "original"
    assert unet_lora_key_layout({"cross_attention_dim": 768}) == "diffusers"


def test_tiny_sdxl_folder_loads_as_sdxl(sdxl_dir):
    from transformers import CLIPTextModel, CLIPTextModelWithProjection

    from library.models.loader import load_components

    parts = load_components(section(str(sdxl_dir)), torch.float32)
    assert parts.family is SDXL
    first, second = parts.text_encoders
    assert type(first) is CLIPTextModel and type(second) is CLIPTextModelWithProjection
    assert parts.text_encoder is first and parts.text_encoders[1] is second
    assert len(parts.tokenizers) == 2 and all(t.model_max_length == 77 for t in parts.tokenizers)
    for module in (parts.denoiser, parts.vae, first, second):
        assert not any(p.requires_grad for p in module.parameters())
    # The UNet's widths agree with the two encoders, as SDXL's do.
    unet = parts.denoiser.config
    assert unet.cross_attention_dim == first.config.hidden_size + second.config.hidden_size
    expected_added = second.config.projection_dim + 6 * unet.addition_time_embed_dim
    assert unet.projection_class_embeddings_input_dim == expected_added
    assert parts.denoiser.add_embedding.linear_1.in_features == expected_added
    assert parts.vae.config.scaling_factor == SDXL.latent_scale
    assert parts.objective.scheduler.config.prediction_type == "epsilon"


def test_tiny_sdxl_folder_is_deterministic(tmp_path):
    from tests.kits.sd.tiny import save_tiny_model

    a = save_tiny_model(tmp_path / "a", "sdxl", seed=3)
    b = save_tiny_model(tmp_path / "b", "sdxl", seed=3)
    files = sorted(p.relative_to(a) for p in a.rglob("*") if p.is_file())
    assert files == sorted(p.relative_to(b) for p in b.rglob("*") if p.is_file())
    for rel in files:
        assert (a / rel).read_bytes() == (b / rel).read_bytes(), rel


def _run() -> RunInfo:
    return RunInfo(
        num_train_images=4,
        num_reg_images=0,
        num_epochs=1,
        epoch=1,
        steps=2,
        max_train_steps=2,
        gradient_accumulation_steps=1,
        batch_size_per_device=1,
        total_batch_size=1,
        training_started_at=1700000000.0,
        training_finished_at=None,
        resolution=(1024, 1024),
    )


def test_sdxl_metadata_values():
    config = Config(
        model=ModelSection(pretrained_model_name_or_path="/models/sdxl"),
        saving=SavingSection(output_name="xl"),
    )
    lora = lora_metadata(config, SDXL, _run())
    assert lora["ss_base_model_version"] == "sdxl_base_v1-0"
    assert lora["ss_v2"] == "False"
    assert lora["modelspec.architecture"] == "stable-diffusion-xl-v1-base/lora"
    # The file's UNet names are SGM's, so its implementation is Stability's, as kohya writes.
    assert lora["modelspec.implementation"] == "https://github.com/Stability-AI/generative-models"
    assert lora["modelspec.prediction_type"] == "epsilon"
    assert lora["modelspec.resolution"] == "1024x1024"
    full = unet_metadata(config, SDXL_V, _run())
    assert full["modelspec.architecture"] == "stable-diffusion-xl-v1-base"
    # a full checkpoint is saved in the original (SGM) layout, labelled as kohya labels those
    assert full["modelspec.implementation"] == "https://github.com/Stability-AI/generative-models"
    assert full["modelspec.prediction_type"] == "v"
    assert full["ss_base_model_version"] == "sdxl_base_v1-0"
