"""Messages that used to mislead: the wrong kind of path, a plain pickle, another family's LoRA,
NaN in a LoRA or in the base model, a damaged FLUX.1 file, an SD3 config given a FLUX.1 file, a
state resumed as another adapter kind."""

import pickle
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

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


# --- messages that name the real cause of a model or network problem -------------------------

FLUX = {"network_module": "networks.lora_flux", "network_train_unet_only": True}


@pytest.fixture(scope="module")
def sd1_lora(tmp_path_factory, tiny_model_dir, images) -> Path:
    """A LoRA file trained for one step on the tiny SD 1.x model."""
    folder = tmp_path_factory.mktemp("lora")
    assert train(write_config(folder / "c.toml", tiny_model_dir, images, folder, max_train_steps=1)) == 0
    return folder / "run.safetensors"


def test_a_nan_in_network_weights_is_named(tmp_path, tiny_model_dir, images, sd1_lora, capsys):
    """It used to train on a NaN loss and advise a lower learning rate."""
    tensors = load_file(str(sd1_lora))
    key = sorted(k for k in tensors if k.endswith("lora_up.weight"))[0]
    tensors[key][0, 0] = float("nan")
    broken = tmp_path / "nan.safetensors"
    save_file(tensors, str(broken))
    config = write_config(tmp_path / "c.toml", tiny_model_dir, images, tmp_path / "o", max_train_steps=1)
    assert train(config, "--network_weights", str(broken), "--dry_run") == 2
    error = _error(capsys)
    assert f"network_weights: {broken} holds NaN or infinite values ({key})" in error
    assert "learning_rate" not in error


def test_a_nan_in_the_base_model_is_named(tmp_path, tiny_model_dir, images, capsys):
    """Found when the loss is not finite (no start-up cost): the tensor is named, not the
    learning rate."""
    model = Path(shutil.copytree(tiny_model_dir, tmp_path / "model"))
    weights = model / "unet" / "diffusion_pytorch_model.safetensors"
    tensors = load_file(str(weights))
    tensors["conv_in.weight"][0, 0, 0, 0] = float("nan")
    save_file(tensors, str(weights))
    config = write_config(tmp_path / "c.toml", model, images, tmp_path / "o", max_train_steps=1)
    assert train(config) == 2
    error = _error(capsys)
    assert "the loss became nan at optimizer step 1 because the model's own weights hold NaN" in error
    assert "(unet.conv_in.weight)" in error and str(model) in error
    assert "learning_rate" not in error


def test_an_sd1_lora_on_a_flux_model_names_flux(tmp_path, flux_folder, images, sd1_lora, capsys):
    config = write_config(tmp_path / "c.toml", flux_folder, images, tmp_path / "o", **FLUX)
    assert train(config, "--network_weights", str(sd1_lora), "--dry_run") == 2
    error = _error(capsys)
    assert f"network_weights: {sd1_lora} is a LoRA for SD 1.x/2.x models (lora_unet_" in error
    assert "the base model is FLUX.1" in error


@pytest.fixture(scope="module")
def flux_folder(kit_folders) -> Path:
    """The session's tiny kit folder (flux dev, seed 0): read only."""
    return kit_folders("flux", "dev")


@pytest.fixture(scope="module")
def flux_files(tmp_path_factory) -> dict[str, Path]:
    from tests.kits.flux.tiny_files import write_tiny_flux_files

    return write_tiny_flux_files(tmp_path_factory.mktemp("flux-files"), "dev", 0)


def _flux_file_keys(files: dict[str, Path]) -> dict[str, str]:
    keys = {k: str(files[k]) for k in ("clip_l", "t5xxl", "ae")}
    return {**keys, "tokenizer_path": str(files["tokenizer"]),
            "t5_tokenizer_path": str(files["t5_tokenizer"])}  # fmt: skip


def test_a_damaged_flux_file_names_flux(tmp_path, flux_files, images, capsys):
    """It used to get the SD loader's message."""
    cut = tmp_path / "flux1-dev.safetensors"
    cut.write_bytes(flux_files["transformer"].read_bytes()[:-100])
    keys = {**FLUX, **_flux_file_keys(flux_files)}
    config = write_config(tmp_path / "c.toml", cut, images, tmp_path / "o", **keys)
    assert train(config, "--dry_run") == 2
    error = _error(capsys)
    assert error.startswith(f"error: pretrained_model_name_or_path: {cut} is corrupt or truncated")
    assert error.endswith("re-download the FLUX.1 (dev or schnell) file")


def test_an_sd3_config_given_a_flux_file_says_so(tmp_path, flux_files, images, capsys):
    """It used to ask for ae, a key SD3 configs do not have."""
    sd3 = {"clip_l": str(flux_files["clip_l"]), "clip_g": str(flux_files["clip_l"]),
           "t5xxl": str(flux_files["t5xxl"]), "network_train_unet_only": True}  # fmt: skip
    model = flux_files["transformer"]
    config = write_config(tmp_path / "c.toml", model, images, tmp_path / "o",
                          network_module="networks.lora_sd3", **sd3)  # fmt: skip
    assert train(config, "--dry_run") == 2
    error = _error(capsys)
    assert 'network_module = "networks.lora_sd3" is for SD3/SD3.5 models' in error
    assert f"pretrained_model_name_or_path {model} is a FLUX.1 model" in error
    config = write_config(tmp_path / "d.toml", model, images, tmp_path / "o", **sd3)
    assert train(config, "--dry_run") == 2
    assert f"clip_g is an SD3/SD3.5 key, and pretrained_model_name_or_path {model} is a FLUX.1" in (
        _error(capsys)
    )


@pytest.mark.parametrize(
    ("saved", "resumed", "kinds"),
    [
        ({}, {"network_module": "lycoris.kohya", "algo": "loha"}, ("LoRA", "LyCORIS (loha)")),
        ({"network_module": "lycoris.kohya"}, {}, ("LyCORIS (lora)", "LoRA")),
    ],
)
def test_a_state_resumed_as_another_adapter_kind_names_both(
    tmp_path, tiny_model_dir, images, capsys, saved, resumed, kinds
):
    """LoRA resumed as LyCORIS used to be refused for LyCORIS' algo, as if the state held
    LyCORIS adapters."""
    out = tmp_path / "o"
    first = write_config(tmp_path / "a.toml", tiny_model_dir, images, out, max_train_steps=1,
                         save_state=True, **saved)  # fmt: skip
    assert train(first) == 0
    state = out / "run-state"
    again = write_config(tmp_path / "b.toml", tiny_model_dir, images, out, max_train_steps=2,
                         **resumed)  # fmt: skip
    assert train(again, "--resume", str(state), "--dry_run") == 2
    error = _error(capsys)
    assert f"resume: {state} holds {kinds[0]} adapters" in error
    assert f"this run trains {kinds[1]} adapters" in error


@pytest.mark.parametrize(
    ("names", "made_for"),
    [
        (["lora_te_text_model_encoder_layers_0_mlp_fc1"], "SD 1.x/2.x"),
        (["lora_te1_text_model_encoder_layers_0_mlp_fc1",
          "lora_te2_text_model_encoder_layers_0_mlp_fc1"], "SDXL or SD3/SD3.5"),
    ],
)  # fmt: skip
def test_a_text_encoder_lora_of_another_family_names_both(
    tmp_path, flux_folder, images, capsys, names, made_for
):
    """Text-encoder-only files used to be called SD 1.x/2.x or SDXL LoRAs "for an SDXL (or SD
    1.x/2.x) base model", whatever the base model was."""
    lora = tmp_path / "te.safetensors"
    save_file({f"{n}.{kind}": torch.zeros(4, 4) for n in names for kind in ("lora_down.weight",
               "lora_up.weight")}, str(lora))  # fmt: skip
    config = write_config(tmp_path / "c.toml", flux_folder, images, tmp_path / "o", **FLUX)
    assert train(config, "--network_weights", str(lora), "--dry_run") == 2
    error = _error(capsys)
    assert f"is a LoRA for {made_for} models" in error and "the base model is FLUX.1" in error
