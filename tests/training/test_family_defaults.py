"""What a run trains follows the model's family before any weight is read: a default the user
never wrote is never refused, and a written value the family cannot honour gets one warning."""

from __future__ import annotations

import json

import pytest

from library.config.provenance import Provenance
from library.config.schema import Config
from library.errors import ConfigError
from library.training.family_defaults import for_family

# pipelines whose LoRAs adapt no text encoder, and one whose LoRAs do (kohya trains CLIP-L)
DENOISER_ONLY = {"ZImagePipeline": "Z-Image", "QwenImagePipeline": "Qwen-Image",
                 "ChromaPipeline": "Chroma"}  # fmt: skip


def _folder(tmp_path, pipeline: str) -> str:
    """A folder whose model_index.json names ``pipeline``: what the family's claim looks at."""
    folder = tmp_path / pipeline
    folder.mkdir()
    (folder / "model_index.json").write_text(json.dumps({"_class_name": pipeline}))
    return str(folder)


def _config(model: str, written_in: str | None = None, **network) -> Config:
    config = Config(
        model={"pretrained_model_name_or_path": model},
        network=network,
        optimizer={"learning_rate": 1e-4},
        datasets=[{"subsets": [{"image_dir": "unused"}]}],
    )
    sources = {key: written_in for key in network} if written_in else {}
    config._provenance = Provenance(("run.toml",), (), sources)
    return config


@pytest.mark.parametrize("pipeline", DENOISER_ONLY)
def test_the_unwritten_default_trains_the_transformer_without_a_word(tmp_path, pipeline):
    config = _config(_folder(tmp_path, pipeline))
    assert config.network.network_train_unet_only is False  # kohya's default
    resolved, notes = for_family(config)
    assert resolved.network.network_train_unet_only is True
    assert notes == []
    assert resolved.model == config.model and resolved.datasets == config.datasets


@pytest.mark.parametrize("pipeline", DENOISER_ONLY)
def test_a_written_false_trains_the_transformer_with_one_warning(tmp_path, pipeline):
    config = _config(_folder(tmp_path, pipeline), "run.toml", network_train_unet_only=False)
    resolved, notes = for_family(config)
    assert resolved.network.network_train_unet_only is True
    assert len(notes) == 1
    assert notes[0].startswith("run.toml: network_train_unet_only = false: ")
    assert f"{DENOISER_ONLY[pipeline]} LoRAs adapt the transformer only" in notes[0]


def test_text_encoder_adapters_alone_are_refused_where_there_are_none(tmp_path):
    config = _config(
        _folder(tmp_path, "ZImagePipeline"), "run.toml", network_train_text_encoder_only=True
    )
    with pytest.raises(ConfigError, match="^network_train_text_encoder_only = true: Z-Image"):
        for_family(config)


@pytest.mark.parametrize("pipeline", ["FluxPipeline", "StableDiffusion3Pipeline"])
def test_families_with_text_encoder_adapters_keep_the_setting(tmp_path, pipeline):
    config = _config(_folder(tmp_path, pipeline))
    assert for_family(config) == (config, [])
    full = _config(_folder(tmp_path, "ZImagePipeline"), train_mode="unet")
    assert for_family(full)[0] is full


def _sd_folder(tmp_path) -> str:
    """A diffusers SD 1.x folder as far as the claims look: its model_index.json."""
    folder = tmp_path / "sd15"
    folder.mkdir()
    index = {
        "_class_name": "StableDiffusionPipeline",
        "unet": ["diffusers", "UNet2DConditionModel"],
        "text_encoder": ["transformers", "CLIPTextModel"],
    }
    (folder / "model_index.json").write_text(json.dumps(index))
    return str(folder)


def _musubi_config(model: str, step_written_in: str | None = None) -> Config:
    """A dataset with musubi-tuner's bucketing and its default step of 16."""
    dataset = {"enable_bucket": True, "bucketing": "musubi", "bucket_reso_steps": 16,
               "subsets": [{"image_dir": "unused"}]}  # fmt: skip
    config = Config(
        model={"pretrained_model_name_or_path": model},
        optimizer={"learning_rate": 1e-4},
        datasets=[dataset],
    )
    sources = {"datasets[0].bucket_reso_steps": step_written_in} if step_written_in else {}
    config._provenance = Provenance(("run.toml",), (), sources)
    return config


def test_an_unwritten_musubi_step_takes_the_grid_of_sd_unets(tmp_path):
    """musubi-tuner's step of 16 does not fit SD 1.x's UNet (64): nobody wrote it, so the run
    takes SD's step rather than refusing it; the rest of the dataset is as it was."""
    config = _musubi_config(_sd_folder(tmp_path))
    resolved, notes = for_family(config)
    assert resolved.datasets[0].bucket_reso_steps == 64 == 8 * 2**3  # the VAE's 8, 3 downsamplings
    assert resolved.datasets[0].model_copy(update={"bucket_reso_steps": 16}) == config.datasets[0]
    assert notes == []


def test_a_written_step_and_a_fitting_step_are_kept(tmp_path):
    written = _musubi_config(_sd_folder(tmp_path), "data.toml")
    assert for_family(written)[0].datasets[0].bucket_reso_steps == 16  # refused with the model
    flux = _musubi_config(_folder(tmp_path, "FluxPipeline"))
    assert for_family(flux)[0] is flux  # 16 is FLUX.1's own grid
