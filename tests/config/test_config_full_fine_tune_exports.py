"""An args file written for a full fine-tuning script (the kohya_ss GUI's DreamBooth and
fine-tune tabs: sdxl_train.py, flux_train.py, sd3_train.py, train_db.py, fine_tune.py) never
trains a LoRA silently: without network_module it is refused, saying to set train_mode =
"unet" (the whole denoiser) or network_module (a LoRA); with either it loads as asked."""

from __future__ import annotations

from pathlib import Path

import pytest

from library.config.kohya_script_keys import FULL_FINE_TUNE_MARKS
from library.config.loader import load_config
from library.errors import ConfigError

EXPORTS = Path(__file__).parent / "full_fine_tune"
FILES = sorted(p.name for p in EXPORTS.glob("*.toml"))
# the keys the GUI writes into every DreamBooth export, per file
MARKS = {
    "kohya_ss_gui_v25_sdxl_dreambooth.toml": ("learning_rate_te1", "learning_rate_te2"),
    "kohya_ss_gui_v25_flux1_dreambooth.toml": ("learning_rate_te", "mem_eff_save"),
}


@pytest.fixture
def export(tmp_path):
    train = tmp_path / "train" / "10_sks dog"
    train.mkdir(parents=True)
    places = {
        "__MODEL__": "/models/sdxl.safetensors",
        "__FLUX_MODEL__": "/models/flux1-dev.safetensors",
        "__FLUX_AE__": "/models/ae.safetensors",
        "__FLUX_CLIP_L__": "/models/clip_l.safetensors",
        "__FLUX_T5XXL__": "/models/t5xxl.safetensors",
        "__TRAIN_DIR__": str(tmp_path / "train"),
        "__OUTPUT_DIR__": str(tmp_path / "out"),
    }

    def write(name: str) -> str:
        text = (EXPORTS / name).read_text(encoding="utf-8")
        for mark, value in places.items():
            text = text.replace(mark, value)
        path = tmp_path / name
        path.write_text(text, encoding="utf-8")
        return str(path)

    return write


def test_every_export_is_listed():
    assert set(FILES) == set(MARKS)


@pytest.mark.parametrize("name", FILES)
def test_a_full_fine_tune_export_is_refused_naming_why(export, name):
    with pytest.raises(ConfigError) as caught:
        load_config(export(name))
    message = str(caught.value)
    assert 'set train_mode = "unet" to fine-tune the whole denoiser' in message, message
    assert "no network_module" in message
    for key in MARKS[name]:
        assert key in message


# what else a fine-tune of that file needs here: FLUX.1's block swap is for LoRAs (refused by
# name with train_mode = "unet")
FULL = {"kohya_ss_gui_v25_flux1_dreambooth.toml": [("blocks_to_swap", "0")]}


@pytest.mark.parametrize("name", FILES)
def test_with_train_mode_unet_it_fine_tunes_the_whole_denoiser(export, name):
    config = load_config(export(name), [("train_mode", "unet"), *FULL.get(name, [])])
    assert config.network.train_mode == "unet"
    # the text encoders' rates are noted, as they only act with train_text_encoder
    assert any("learning_rate_te" in note for note in config.notices), config.notices


def test_what_the_fine_tune_cannot_do_is_still_named(export):
    name = "kohya_ss_gui_v25_flux1_dreambooth.toml"
    with pytest.raises(ConfigError, match='blocks_to_swap = 8 .*train_mode = "unet"'):
        load_config(export(name), [("train_mode", "unet")])


@pytest.mark.parametrize("name", FILES)
def test_with_a_network_module_it_trains_that_lora(export, name):
    lora = [("network_module", "networks.lora"), ("network_train_unet_only", "true")]
    config = load_config(export(name), lora)
    assert config.network.train_mode == "lora"


def test_a_config_without_those_options_keeps_the_lora_default(write_toml):
    text = 'pretrained_model_name_or_path = "m"\nlearning_rate = 1e-4\n'
    text += '[[datasets]]\n[[datasets.subsets]]\nimage_dir = "img"\n'
    assert load_config(write_toml("a.toml", text)).network.train_mode == "lora"


def test_the_marks_are_options_no_lora_script_defines():
    from tests.config.kohya_arguments import KOHYA_SCRIPTS

    for key in FULL_FINE_TUNE_MARKS:
        scripts = KOHYA_SCRIPTS.get(key, ())
        assert not any(script.endswith("_network") for script in scripts), (key, scripts)
