"""render_toml writes difftune's sectioned TOML that loads back to an equal Config."""

from __future__ import annotations

import tomllib

import pytest

from library.config.loader import load_config
from library.config.render import render_toml

RICH = """\
[model_arguments]
pretrained_model_name_or_path = "/models/sd21"
v2 = true
v_parameterization = true

[network_arguments]
network_dim = 16
network_alpha = 8
network_args = ["conv_dim=4", "conv_alpha=1"]
unet_lr = 2e-4

[optimizer_arguments]
optimizer_type = "AdamW8bit"
optimizer_args = { weight_decay = 0.01, betas = [0.9, 0.99], amsgrad = true }
lr_warmup_steps = 0.1
lr_scheduler = "polynomial"

[training_arguments]
mixed_precision = "bf16"
max_train_steps = 300
cache_latents = false

[saving_arguments]
output_name = 'name with "quotes" and ü'
metadata_tags = "a, b"

[general]
caption_extension = ".cap"

[[datasets]]
resolution = "768,512"
batch_size = 2
  [[datasets.subsets]]
  image_dir = "C:\\\\images\\\\dog"
  class_tokens = "sks dog"
  num_repeats = 3
  [[datasets.subsets]]
  image_dir = "reg"
  is_reg = true
"""


def round_trip(write_toml, cfg):
    text = render_toml(cfg)
    return text, load_config(write_toml("rendered.toml", text))


def test_round_trip_of_inline_datasets(write_toml):
    cfg = load_config(write_toml("a.toml", RICH))
    text, again = round_trip(write_toml, cfg)
    assert again == cfg
    doc = tomllib.loads(text)
    # Sectioned layout, None values omitted, datasets fully resolved.
    assert set(doc) == {
        "model",
        "network",
        "optimizer",
        "training",
        "data",
        "saving",
        "logging",
        "sampling",
        "datasets",
    }
    assert "metadata_author" not in doc["saving"] and "log_with" not in doc["logging"]
    assert doc["datasets"][0]["subsets"][1] == {
        "image_dir": "reg",
        "caption_extension": ".cap",
        "num_repeats": 1,
        "is_reg": True,
    }
    assert doc["optimizer"]["optimizer_args"] == {
        "weight_decay": 0.01,
        "betas": [0.9, 0.99],
        "amsgrad": True,
    }


def test_round_trip_of_dataset_config_and_cli_overrides(write_toml):
    dataset = write_toml(
        "d.toml",
        "[general]\nnum_repeats = 4\n[[datasets]]\n[[datasets.subsets]]\nimage_dir = 'x'\n",
    )
    path = write_toml(
        "a.toml", f'pretrained_model_name_or_path = "m"\ndataset_config = {dataset!r}\n'
    )
    cfg = load_config(path, [("resolution", "640"), ("seed", "7")])
    text, again = round_trip(write_toml, cfg)
    assert again == cfg
    assert "# [[datasets.subsets]]" in text  # resolved datasets shown, as comments
    assert "# num_repeats = 4" in text  # with what each subset got from [general]
    assert tomllib.loads(text)["data"]["dataset_config"] == dataset


def test_round_trip_of_train_data_dir(tmp_path, write_toml, monkeypatch):
    pytest.importorskip("library.data.folders")
    (tmp_path / "train" / "5_a b").mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    cfg = load_config(
        write_toml("a.toml", 'pretrained_model_name_or_path = "m"\ntrain_data_dir = "train"\n')
    )
    _, again = round_trip(write_toml, cfg)
    assert again == cfg
    # dataset keys written as plain keys survive, though the datasets are only comments
    head = 'pretrained_model_name_or_path = "m"\ntrain_data_dir = "train"\n'
    cfg = load_config(write_toml("b.toml", head + "shuffle_caption = true\nkeep_tokens = 2\n"))
    text, again = round_trip(write_toml, cfg)
    assert again == cfg and again.datasets[0].subsets[0].keep_tokens == 2
    assert "[dataset_defaults]" in text
