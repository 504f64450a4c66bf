"""Every kohya argument (of every sd-scripts training script) loads at its off/default value,
and "not set" values change nothing."""

from __future__ import annotations

import pytest

from library.config.loader import load_config
from library.errors import ConfigError
from tests.config.kohya_arguments import KOHYA_OFF_VALUES, KOHYA_SCRIPT_DEFAULTS

HEAD = 'pretrained_model_name_or_path = "m"\n'
DATASET = '[[datasets]]\n[[datasets.subsets]]\nimage_dir = "img"\n'

# Values kohya's own code reads as "off" although they are not argparse defaults: kohya tests
# these options for truth (``if args.min_snr_gamma:``) and GUIs write them (kohya_ss: 0 fields).
TRUTHY_OFF_VALUES = {
    "min_snr_gamma": 0,
    "ddp_timeout": 0,
    "noise_offset": 0,
    "ip_noise_gamma": 0,
    "multires_noise_iterations": 0,
    "v_pred_like_loss": 0,
    "network_dropout": 0,
    "scale_weight_norms": 0,
    "save_n_epoch_ratio": 0,
    "resume": False,
    "vae": False,
}

# The one key that cannot be off: without it there is nothing to train.
_REQUIRED = {"pretrained_model_name_or_path"}

# Scripts of trainings difftune does not do: a default that only they have may be refused, by
# name (save_model_as = "pt", textual inversion's embedding format).
_OTHER_TRAININGS = {
    "train_textual_inversion",
    "train_textual_inversion_XTI",
    "sdxl_train_textual_inversion",
}


def _only_other_trainings(key: str, value: object) -> bool:
    defaults = KOHYA_SCRIPT_DEFAULTS.get(key, {})
    scripts = next((s for default, s in defaults.items() if default == value), ())
    return bool(scripts) and set(scripts) <= _OTHER_TRAININGS


def _toml(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return f'"{value}"'
    if isinstance(value, list):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    return repr(value)


def _cases():
    for key, values in sorted(KOHYA_OFF_VALUES.items()):
        if key in _REQUIRED:
            continue
        for value in values:
            yield pytest.param(key, value, id=f"{key}={_toml(value)}")
    for key, value in TRUTHY_OFF_VALUES.items():
        yield pytest.param(key, value, id=f"{key}={_toml(value)}-truthy")


@pytest.fixture(scope="module")
def plain(tmp_path_factory):
    path = tmp_path_factory.mktemp("plain") / "plain.toml"
    path.write_text(HEAD + DATASET, encoding="utf-8")
    return load_config(str(path))


@pytest.mark.parametrize(("key", "value"), list(_cases()))
def test_kohya_off_value_loads(write_toml, plain, key, value):
    path = write_toml("a.toml", HEAD + f"{key} = {_toml(value)}\n" + DATASET)
    if _only_other_trainings(key, value):
        with pytest.raises(ConfigError, match=f"{key} = .* is not supported"):
            load_config(path)
        return
    config = load_config(path)
    unset = value == "" or value == [] or value is False and key in ("resume", "vae")
    if unset or key in TRUTHY_OFF_VALUES:
        # "not set" and kohya's off values must not change what is trained
        assert config.model_copy(update={"dataset_defaults": {}}) == plain, key


def test_empty_string_reg_data_dir_is_not_the_current_folder(write_toml, tmp_path, monkeypatch):
    # Before, reg_data_dir = "" read the folder the run started in as regularisation images.
    (tmp_path / "train" / "5_dog").mkdir(parents=True)
    (tmp_path / "2_cat").mkdir()  # would be a reg subset if "" meant "."
    monkeypatch.chdir(tmp_path)
    path = write_toml(
        "k.toml", HEAD + 'train_data_dir = "train"\nreg_data_dir = ""\nvae = ""\nresume = ""\n'
    )
    config = load_config(path)
    assert config.data.reg_data_dir is None and config.saving.resume is None
    assert [s.image_dir for d in config.datasets for s in d.subsets] == ["train/5_dog"]
    assert not any(s.is_reg for d in config.datasets for s in d.subsets)


def test_command_line_empty_value_unsets_the_file(write_toml):
    path = write_toml("a.toml", HEAD + 'vae = "my.vae.safetensors"\n' + DATASET)
    assert load_config(path).model.vae == "my.vae.safetensors"
    assert load_config(path, [("vae", "")]).model.vae is None


def test_gui_value_forms(write_toml):
    path = write_toml(
        "gui.toml",
        HEAD
        + "persistent_data_loader_workers = 1\nmin_snr_gamma = 0\n"
        + 'caption_extension = "txt"\ntext_encoder_lr = [5e-5]\n'
        + 'network_args = ["conv_dim=0"]\n'
        + DATASET,
    )
    config = load_config(path)
    assert config.training.persistent_data_loader_workers is True
    assert config.training.min_snr_gamma is None
    assert config.data.caption_extension == ".txt"
    assert config.network.text_encoder_lr == [5e-5]
    assert config.network.conv_dim is None  # kohya skips layers of rank 0


def test_config_file_without_its_suffix_is_found_as_kohya_does(write_toml):
    path = write_toml("preset.toml", HEAD + DATASET)
    assert load_config(path.removesuffix(".toml")) == load_config(path)
