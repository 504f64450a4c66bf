"""What FLUX.2's family says and refuses before any weight is read."""

from __future__ import annotations

import logging

import pytest

from library.config.schema import Config
from library.errors import ConfigError
from library.models.families.flux2.family import flux2_family


def _config(**network):
    return Config(model={"pretrained_model_name_or_path": "m"},
                  network={"network_module": "networks.lora_flux_2", **network},
                  optimizer={"learning_rate": 1e-4},
                  datasets=[{"subsets": [{"image_dir": "unused"}]}])  # fmt: skip


def test_a_lora_run_has_no_split_qkv_note_and_conv_dim_is_refused(caplog):
    family = flux2_family("klein", "4b", False)
    with caplog.at_level(logging.WARNING):
        family.check_training(_config())
    assert "split_qkv" not in caplog.text
    with pytest.raises(ConfigError, match="conv_dim: FLUX.2's transformer has no convolutions"):
        family.check_training(_config(conv_dim=4))


def test_a_distilled_klein_is_named_so_with_a_warning(caplog):
    with caplog.at_level(logging.WARNING):
        family = flux2_family("klein", "4b", True)
    assert "distilled" in family.describe() and "[klein] base" in family.describe()
    assert "train on FLUX.2 [klein] base" in caplog.text
    assert "distilled" not in flux2_family("klein", "4b", False).describe()
