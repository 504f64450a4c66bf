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
