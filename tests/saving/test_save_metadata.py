"""ss_* and modelspec.* metadata: every key consumers read, as strings, from config and run."""

from __future__ import annotations

import json
from dataclasses import dataclass

import torch

from library.config.schema import (
    Config,
    ModelSection,
    NetworkSection,
    OptimizerSection,
    SavingSection,
    TrainingSection,
)
from library.saving.lora_file import read_lora_file, save_lora_file
from library.saving.metadata import RunInfo, lora_metadata, unet_metadata

# docs/formats.md (LoRA files), written out.
FORMAT_KEYS = [
    "ss_network_module",
    "ss_network_dim",
    "ss_network_alpha",
    "ss_network_args",
    "ss_base_model_version",
    "ss_v2",
    "ss_learning_rate",
    "ss_unet_lr",
    "ss_text_encoder_lr",
    "ss_num_train_images",
    "ss_num_reg_images",
    "ss_num_epochs",
    "ss_epoch",
    "ss_steps",
    "ss_max_train_steps",
    "ss_gradient_accumulation_steps",
    "ss_batch_size_per_device",
    "ss_total_batch_size",
    "ss_resolution",
    "ss_mixed_precision",
    "ss_optimizer",
    "ss_lr_scheduler",
    "ss_seed",
    "ss_clip_skip",
    "ss_noise_offset",
    "ss_min_snr_gamma",
    "ss_training_started_at",
    "ss_training_finished_at",
    "ss_output_name",
    "ss_sd_model_name",
    "ss_tag_frequency",
    "ss_dataset_dirs",
    "modelspec.sai_model_spec",
    "modelspec.architecture",
    "modelspec.implementation",
    "modelspec.title",
    "modelspec.date",
    "modelspec.resolution",
    "modelspec.prediction_type",
]


@dataclass(frozen=True)
class Family:
    """Stand-in for library.models.families.base.ModelFamily."""

    name: str
    v2: bool
    prediction_type: str
    base_model_version: str
    modelspec_architecture: str
    default_resolution: int

    def metadata_keys(self, config) -> dict:
        return {}  # SD families add no ss_* keys of their own


SD1 = Family("sd1", False, "epsilon", "sd_v1", "stable-diffusion-v1", 512)
SD2V = Family("sd2-v", True, "v_prediction", "sd_v2_v", "stable-diffusion-v2-768-v", 768)


def _config(network=None, saving=None, optimizer=None, training=None) -> Config:
    return Config(
        model=ModelSection(pretrained_model_name_or_path="/models/sd15"),
        network=network or NetworkSection(),
        saving=saving or SavingSection(output_name="dog"),
        optimizer=optimizer or OptimizerSection(),
        training=training or TrainingSection(),
    )


def _run(**changes) -> RunInfo:
    values = dict(
        num_train_images=40,
        num_reg_images=10,
        num_epochs=5,
        epoch=2,
        steps=120,
        max_train_steps=300,
        gradient_accumulation_steps=2,
        batch_size_per_device=2,
        total_batch_size=8,
        training_started_at=1700000000.5,
        training_finished_at=None,
        tag_frequency={"10_sks dog": {"sks dog": 40, "grass": 3}},
        dataset_dirs={"10_sks dog": {"n_repeats": 10, "img_count": 4}},
        sd_model_name="sd15",
        resolution=(768, 512),
    )
    values.update(changes)
    return RunInfo(**values)


def test_every_format_key_is_a_string():
    meta = lora_metadata(_config(), SD1, _run())
    assert set(FORMAT_KEYS) <= set(meta)
    assert all(isinstance(v, str) for v in meta.values())
    assert meta["modelspec.sai_model_spec"] == "1.0.1"
    assert meta["modelspec.architecture"] == "stable-diffusion-v1/lora"
    assert meta["modelspec.prediction_type"] == "epsilon"
    assert meta["modelspec.resolution"] == "768x512"
    assert meta["modelspec.title"] == "dog"
    assert meta["ss_base_model_version"] == "sd_v1" and meta["ss_v2"] == "False"
    assert meta["ss_network_module"] == "networks.lora"
    assert meta["ss_network_dim"] == "4" and float(meta["ss_network_alpha"]) == 1.0
    assert meta["ss_steps"] == "120" and meta["ss_total_batch_size"] == "8"
    assert meta["ss_training_finished_at"] == "None"
    assert float(meta["ss_training_started_at"]) == 1700000000.5
    assert meta["ss_sd_model_name"] == "sd15" and meta["ss_output_name"] == "dog"
    assert json.loads(meta["ss_tag_frequency"]) == {"10_sks dog": {"sks dog": 40, "grass": 3}}
    assert json.loads(meta["ss_dataset_dirs"])["10_sks dog"]["n_repeats"] == 10
    assert json.loads(meta["ss_network_args"]) == {}
    assert meta["ss_optimizer"] == "torch.optim.adamw.AdamW"


def test_v_prediction_sd2():
    meta = lora_metadata(_config(), SD2V, _run())
    assert meta["modelspec.architecture"] == "stable-diffusion-v2-768-v/lora"
    assert meta["modelspec.prediction_type"] == "v"
    assert meta["ss_v2"] == "True" and meta["ss_base_model_version"] == "sd_v2_v"


def test_learning_rates_and_network_args():
    config = _config(
        network=NetworkSection(
            network_dim=16,
            network_alpha=8.0,
            conv_dim=8,
            network_args=["conv_alpha=4", "dropout = 0.1"],
            unet_lr=2e-4,
            network_train_unet_only=True,
        ),
        optimizer=OptimizerSection(
            optimizer_type="AdamW8bit", optimizer_args=["weight_decay=0.01"], learning_rate=1e-4
        ),
    )
    meta = lora_metadata(config, SD1, _run(training_finished_at=1700000500.0))
    assert json.loads(meta["ss_network_args"]) == {
        "conv_dim": "8",
        "conv_alpha": "4",
        "dropout": "0.1",
    }
    assert float(meta["ss_learning_rate"]) == 1e-4
    assert float(meta["ss_unet_lr"]) == 2e-4
    assert meta["ss_text_encoder_lr"] == "None"  # the text encoder is not trained
    assert meta["ss_network_dim"] == "16" and float(meta["ss_network_alpha"]) == 8.0
    assert meta["ss_optimizer"] == "bitsandbytes.optim.adamw.AdamW8bit(weight_decay=0.01)"
    assert float(meta["ss_training_finished_at"]) == 1700000500.0


def test_user_metadata_and_comment():
    saving = SavingSection(
        output_name="dog",
        metadata_title="Good Dog",
        metadata_author="me",
        metadata_description="a dog",
        metadata_license="CC0",
        metadata_tags="dog,photo",
        training_comment="trained on my dog",
    )
    meta = lora_metadata(_config(saving=saving), SD1, _run())
    assert meta["modelspec.title"] == "Good Dog"
    assert meta["modelspec.author"] == "me"
    assert meta["modelspec.description"] == "a dog"
    assert meta["modelspec.license"] == "CC0"
    assert meta["modelspec.tags"] == "dog,photo"
    assert meta["ss_training_comment"] == "trained on my dog"


def test_no_metadata_keeps_only_network_structure():
    saving = SavingSection(output_name="dog", no_metadata=True)
    meta = lora_metadata(_config(saving=saving), SD1, _run())
    ss_keys = {k for k in meta if k.startswith("ss_")}
    assert ss_keys == {
        "ss_v2",
        "ss_base_model_version",
        "ss_network_module",
        "ss_network_dim",
        "ss_network_alpha",
        "ss_network_args",
    }
    assert "ss_tag_frequency" not in meta and "ss_dataset_dirs" not in meta
    assert meta["modelspec.architecture"] == "stable-diffusion-v1/lora"


def test_unet_metadata_is_a_full_model():
    meta = unet_metadata(_config(), SD2V, _run())
    assert meta["modelspec.architecture"] == "stable-diffusion-v2-768-v"
    assert not [k for k in meta if k.startswith("ss_network")]
    assert meta["ss_steps"] == "120" and meta["ss_v2"] == "True"
    assert float(meta["ss_unet_lr"]) == 1e-4
    # the file is in the original layout: kohya labels such checkpoints with Stability's code
    assert meta["modelspec.implementation"] == "https://github.com/Stability-AI/generative-models"


def test_metadata_survives_the_file(tmp_path):
    meta = lora_metadata(_config(), SD1, _run())
    name = "lora_unet_mid_block_attentions_0_proj_in"
    tensors = {
        f"{name}.lora_down.weight": torch.zeros(4, 32, 1, 1),
        f"{name}.lora_up.weight": torch.zeros(32, 4, 1, 1),
    }
    path = tmp_path / "m.safetensors"
    save_lora_file(path, tensors, meta, torch.float16)
    _, read = read_lora_file(path)
    assert {k: read[k] for k in meta} == meta
