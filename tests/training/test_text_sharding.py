"""fsdp_text_encoder before any process starts: the units a text encoder is sharded by, the
refusals of what would need the encoder after the cache fill, the one-process note, and the
memory estimate's share (the 2-process fill itself: tests/distributed/test_text_fsdp.py)."""

from __future__ import annotations

import itertools
import math
from types import SimpleNamespace

import pytest
import torch

from library.config.schema import Config
from library.errors import ConfigError
from library.models.loader import load_components
from library.training import memory_estimate
from library.training.setup import setup_training
from library.training.text_sharding import check_text_sharding, layer_units


def _tiny(kind: str) -> torch.nn.Module:
    from transformers import (
        CLIPTextConfig,
        CLIPTextModel,
        Qwen3Config,
        Qwen3Model,
        T5Config,
        T5EncoderModel,
    )

    if kind == "clip":
        return CLIPTextModel(CLIPTextConfig(vocab_size=50, hidden_size=8, intermediate_size=16,
                                            num_hidden_layers=3, num_attention_heads=2))  # fmt: skip
    if kind == "t5":
        return T5EncoderModel(T5Config(vocab_size=50, d_model=8, d_ff=16, num_layers=3,
                                       num_heads=2, d_kv=4))  # fmt: skip
    return Qwen3Model(Qwen3Config(vocab_size=50, hidden_size=8, intermediate_size=16,
                                  num_hidden_layers=3, num_attention_heads=2,
                                  num_key_value_heads=1, head_dim=4))  # fmt: skip


@pytest.mark.parametrize(
    ("kind", "layers"),
    [
        ("clip", lambda m: m.encoder.layers),
        ("t5", lambda m: m.encoder.block),  # each block's own sublayer list stays inside it
        ("qwen3", lambda m: m.layers),
    ],
)
def test_a_text_encoder_is_sharded_by_its_layers(kind, layers):
    model = _tiny(kind)
    assert [id(u) for u in layer_units(model)] == [id(layer) for layer in layers(model)]


def _config(subset=None, **sections) -> Config:
    base = {
        "model": {"pretrained_model_name_or_path": "unused"},
        "network": {"network_train_unet_only": True},
        "optimizer": {"learning_rate": 1e-4},
        "data": {"cache_text_encoder_outputs": True},
        "training": {"fsdp_text_encoder": True},
        "datasets": [{"subsets": [{"image_dir": "unused", **(subset or {})}]}],
    }
    for section, keys in sections.items():
        base[section] = {**base[section], **keys}
    return Config(**base)


_ENTRY = SimpleNamespace(edit=None, label="Tiny")
_FAMILY = SimpleNamespace(TEXT_READS_REFERENCES=False)


def test_the_word_with_several_processes_and_a_fixed_fill_passes():
    assert check_text_sharding(_config(), _ENTRY, _FAMILY, 2) == []
    off = _config(training={"fsdp_text_encoder": False}, data={"cache_text_encoder_outputs": False})
    assert check_text_sharding(off, _ENTRY, _FAMILY, 1) == []


def test_one_process_gets_a_note_not_a_refusal():
    (note,) = check_text_sharding(_config(), _ENTRY, _FAMILY, 1)
    assert "fsdp_text_encoder" in note and "one process" in note


@pytest.mark.parametrize(
    ("config", "family", "names"),
    [
        # (with the cache, the config itself refuses trained encoders)
        (lambda: _config(network={"network_train_unet_only": False},
                         data={"cache_text_encoder_outputs": False}), _FAMILY,
         "network_train_unet_only = true"),
        (lambda: _config(data={"cache_text_encoder_outputs": False}), _FAMILY,
         "cache_text_encoder_outputs = true"),
        (lambda: _config(subset={"shuffle_caption": True}), _FAMILY, "datasets[0].subsets[0]"),
        (lambda: _config(), SimpleNamespace(TEXT_READS_REFERENCES=True), "reference images"),
    ],
)  # fmt: skip
def test_what_needs_the_encoder_after_the_fill_is_refused(config, family, names):
    with pytest.raises(ConfigError) as error:
        check_text_sharding(config(), _ENTRY, family, 2)
    message = str(error.value)
    assert "\n" not in message
    assert "fsdp_text_encoder" in message and names in message


def _bytes(module: torch.nn.Module) -> int:
    tensors = {id(t): t for t in [*module.parameters(), *module.buffers()]}
    return sum(t.numel() * t.element_size() for t in tensors.values())


def test_the_estimate_holds_a_share_of_the_sharded_encoder(tiny_model_dir):
    config = _config(model={"pretrained_model_name_or_path": str(tiny_model_dir)})
    parts = setup_training(config, load_components(config.model, torch.float32))
    encoder = parts.components.text_encoder
    whole = _bytes(encoder)
    layers = sorted((_bytes(layer) for layer in encoder.encoder.layers), reverse=True)
    rest = whole - sum(layers)  # embeddings and the final norm: gathered throughout
    stats = SimpleNamespace(datasets=[SimpleNamespace(buckets=[], resolution=(64, 64),
                                                      batch_size=1)])  # fmt: skip
    for world_size, samples in itertools.product((2, 4), (False, True)):
        # sample prompts too: the sharded copies encode them during the fill, then leave
        found = memory_estimate.estimate_peak_memory(config, parts, stats, world_size, samples)
        assert found.text_caching == math.ceil(whole / world_size) + rest + sum(layers[:2])
        # and the training weights hold no encoder (one process with samples keeps it whole)
        stays = memory_estimate.weight_bytes(config, parts, True, 1)
        assert memory_estimate.weight_bytes(config, parts, samples, world_size) == stays - whole
    one = memory_estimate.estimate_peak_memory(config, parts, stats, 1, False)
    assert one.text_caching == whole  # one process: nothing to shard with
    # one process with sample prompts: the whole encoders stay to encode them in the rounds
    assert memory_estimate.estimate_peak_memory(config, parts, stats, 1, True).text_caching == 0


def _trainer(tmp_path, model_dir, **keys):
    from library.config.loader import load_config
    from library.training.trainer import Trainer
    from tests.integration.harness import make_images, reset_accelerate, write_config

    images = make_images(tmp_path / "imgs", 2)
    path = write_config(tmp_path / "run.toml", model_dir, images, tmp_path / "out",
                        network_train_unet_only=True, cache_text_encoder_outputs=True,
                        fsdp_text_encoder=True, **keys)  # fmt: skip
    reset_accelerate()
    try:
        return Trainer(load_config(str(path)))
    finally:
        reset_accelerate()


def test_the_trainer_checks_the_word_before_loading(tmp_path, tiny_model_dir):
    """The run's own check (the dry run's too): sample prompts taken (encoded during the
    fill), one process noted, a varying caption refused."""
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("a square --w 64 --h 64\n", encoding="utf-8")
    trainer = _trainer(tmp_path / "a", tiny_model_dir, sample_prompts=str(prompts))
    assert trainer.sampler.enabled
    assert any("fsdp_text_encoder = true has no effect" in n for n in trainer.family_notes)
    with pytest.raises(ConfigError, match="datasets\\[0\\].subsets\\[0\\]"):
        _trainer(tmp_path / "b", tiny_model_dir, subset_keys={"shuffle_caption": True})
