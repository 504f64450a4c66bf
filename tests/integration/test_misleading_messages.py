"""Messages that used to mislead: the wrong kind of path, a plain pickle, another family's LoRA."""

import pickle

import pytest
import torch

from tests.integration.harness import make_images, train, write_config


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    return make_images(tmp_path_factory.mktemp("data") / "imgs", 2)


def _error(capsys) -> str:
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert len(lines) == 1, lines
    return lines[0]


def test_a_file_where_a_folder_belongs_is_called_a_file(tmp_path, tiny_model_dir, images, capsys):
    a_file = tmp_path / "notes.txt"
    a_file.write_text("x")
    config = write_config(tmp_path / "c.toml", tiny_model_dir, images, tmp_path / "o", max_train_steps=1)
    text = config.read_text().replace(f'image_dir = "{images}"', f'image_dir = "{a_file}"')
    config.write_text(text)
    assert train(config) == 2
    assert f"image_dir {a_file} is a file, not a folder" in _error(capsys)
    config = write_config(tmp_path / "d.toml", tiny_model_dir, images, tmp_path / "o", max_train_steps=1)
    assert train(config, "--network_weights", str(tmp_path)) == 2
    assert f"network_weights: {tmp_path} is a folder; give the LoRA's .safetensors file" in _error(capsys)
    assert train(config, "--resume", str(a_file)) == 2
    assert f"resume: {a_file} is a file; give the *-state folder" in _error(capsys)


def test_train_data_dir_that_is_a_file(tmp_path):
    from library.config.loader import load_config
    from library.errors import DataError

    a_file = tmp_path / "train"
    a_file.write_text("x")
    config = tmp_path / "c.toml"
    config.write_text(f'pretrained_model_name_or_path = "m"\ntrain_data_dir = "{a_file}"\n')
    with pytest.raises(DataError, match=f"training image folder {a_file} is a file, not a folder"):
        load_config(str(config))


def test_a_plain_pickle_is_not_called_corrupt(tmp_path):
    from library.errors import ModelError
    from library.models.checkpoint_file import CheckpointFile

    path = tmp_path / "model.ckpt"
    with open(path, "wb") as file:
        pickle.dump({"w": torch.zeros(2)}, file)
    with pytest.raises(ModelError) as info:
        CheckpointFile(path)
    assert "is a plain Python pickle" in str(info.value) and "corrupt" not in str(info.value)


def test_an_sdxl_lora_on_an_sd1_model_names_the_families(tmp_path, tiny_model_dir, tiny_sdxl_model_dir, images, capsys):
    xl = write_config(tmp_path / "xl.toml", tiny_sdxl_model_dir, images, tmp_path / "xl", max_train_steps=1)
    assert train(xl) == 0
    config = write_config(tmp_path / "sd1.toml", tiny_model_dir, images, tmp_path / "sd1", max_train_steps=1)
    assert train(config, "--network_weights", str(tmp_path / "xl" / "run.safetensors")) == 2
    error = _error(capsys)
    assert "is a LoRA for SDXL models" in error and "the base model is SD 1.x/2.x" in error
    assert "network_train_unet_only = false" not in error  # it already is
