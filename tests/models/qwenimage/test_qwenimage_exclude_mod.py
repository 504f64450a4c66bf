"""musubi-tuner's networks.lora_qwen_image argument exclude_mod: by default (and with
exclude_mod=True) a Qwen-Image LoRA leaves out every block's timestep modulation Linears
(img_mod, txt_mod), as musubi-tuner does; exclude_mod=False adapts them as well."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from library.config.loader import load_config
from library.errors import ConfigError
from library.models.families.qwenimage.load import load_qwenimage

DATASET = '[[datasets]]\n[[datasets.subsets]]\nimage_dir = "img"\n'


def _config(tmp_path, model_dir, lines: str):
    path = tmp_path / "a.toml"
    path.write_text(f'pretrained_model_name_or_path = "{model_dir}"\n' + lines + DATASET)
    return load_config(str(path))


def _modulation_linears(transformer: nn.Module) -> set[str]:
    """The blocks' modulation Linears, found by their names in the model itself."""
    return {
        path
        for path, module in transformer.named_modules()
        if isinstance(module, nn.Linear) and (".img_mod." in path or ".txt_mod." in path)
    }


def _targets(config) -> tuple[set[str], nn.Module]:
    parts = load_qwenimage(config.model, config.flow, torch.float32, torch.float32)
    return set(parts.family.adapter_targets(parts.denoiser, "unet", False)), parts.denoiser


@pytest.mark.parametrize(
    ("lines", "adapted"),
    [
        ("", False),  # musubi-tuner's default
        ('network_args = ["exclude_mod=True"]\n', False),
        ('network_args = ["exclude_mod=False"]\n', True),
        ("exclude_mod = false\n", True),
    ],
)
def test_exclude_mod_chooses_whether_the_modulation_is_adapted(
    tmp_path, qwenimage_dir, lines, adapted
):
    network = 'network_module = "networks.lora_qwen_image"\n'
    config = _config(tmp_path, qwenimage_dir, network + lines)
    targets, transformer = _targets(config)
    modulation = _modulation_linears(transformer)
    assert modulation  # the tiny model has them (2 blocks x img_mod, txt_mod)
    assert (modulation <= targets) == adapted
    assert modulation.isdisjoint(targets) == (not adapted)
    # the rest of the set is the same either way
    default, _ = _targets(_config(tmp_path, qwenimage_dir, network))
    assert targets - modulation == default


def test_exclude_mod_with_lycoris_is_refused(tmp_path, qwenimage_dir):
    from library.models.families.qwenimage.family import qwenimage_family

    lines = (
        "network_train_unet_only = true\n"  # LoRAs of the transformer alone
        'network_module = "lycoris.kohya"\nnetwork_args = ["algo=lokr", "exclude_mod=False"]\n'
    )
    config = _config(tmp_path, qwenimage_dir, lines)
    with pytest.raises(ConfigError, match="exclude_mod.*preset"):
        qwenimage_family(config.flow).check_training(config)


def test_exclude_mod_is_a_qwen_image_setting(tmp_path):
    from library.config.flow_schema import FlowSection
    from library.models.families.registry import FAMILIES

    assert "exclude_mod" in FlowSection.model_fields
    readers = {entry.name for entry in FAMILIES if "exclude_mod" in entry.flow_keys}
    assert readers == {"qwenimage", "qwenimage_edit", "qwenimage_edit_plus"}
