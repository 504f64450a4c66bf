"""Single files that cannot be used give one clear line naming the file, never a traceback."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from library.config.schema import ModelSection
from library.errors import ModelError
from library.models.families.sd.family import SD1
from library.models.loader import load_components
from library.saving.checkpoint_export import write_single_file
from tests.kits.sd.tiny import build_tiny_components, tiny_unet_config

TOKENIZER = Path(__file__).parents[1] / "assets" / "tokenizer"


@pytest.fixture(scope="module")
def sd1_file(tmp_path_factory) -> Path:
    parts = build_tiny_components("sd1")
    path = tmp_path_factory.mktemp("sf") / "sd1.safetensors"
    return write_single_file(
        path, parts["unet"], parts["vae"], [parts["text_encoder"]], SD1, torch.float32
    )


@pytest.fixture
def empty_hub_cache(tmp_path, monkeypatch) -> Path:
    from huggingface_hub import constants

    cache = tmp_path / "hub"
    cache.mkdir()
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    return cache


def error_of(path: Path, **flags) -> str:
    flags.setdefault("tokenizer_path", str(TOKENIZER))
    model = ModelSection(pretrained_model_name_or_path=str(path), **flags)
    with pytest.raises(ModelError) as info:
        load_components(model, torch.float32)
    message = str(info.value)
    assert "\n" not in message
    return message


def test_truncated_file(sd1_file, tmp_path):
    data = sd1_file.read_bytes()
    path = tmp_path / "cut.safetensors"
    path.write_bytes(data[: len(data) // 2])
    message = error_of(path)
    assert str(path) in message and "corrupt or truncated" in message


def test_truncated_ckpt(sd1_file, tmp_path):
    path = tmp_path / "cut.ckpt"
    torch.save({"state_dict": load_file(sd1_file)}, path)
    path.write_bytes(path.read_bytes()[:5000])
    assert "corrupt or truncated" in error_of(path)


@pytest.mark.parametrize(
    ("keys", "says"),
    [
        (["foo.weight", "bar.bias"], "keys like bar.bias, foo.weight"),
        (["lora_unet_down_blocks_0_attentions_0_proj_in.lora_down.weight"], "a LoRA"),
        (["down_blocks.0.resnets.0.conv1.weight"], "one part of a diffusers folder"),
        (["encoder.down.0.block.0.conv1.weight"], "an autoencoder alone"),
    ],
)
def test_foreign_safetensors(tmp_path, keys, says):
    """No family reads these: the message says what the file holds, not what SD lacks."""
    path = tmp_path / "other.safetensors"
    save_file({k: torch.zeros(2) for k in keys}, path)
    message = error_of(path)
    assert str(path) in message and "not a model difftune trains" in message
    assert says in message


def test_pickled_code_is_refused_and_never_runs(sd1_file, tmp_path):
    marker = tmp_path / "ran"

    class Payload:
        def __reduce__(self):
            return (os.makedirs, (str(marker),))

    path = tmp_path / "evil.ckpt"
    torch.save({"state_dict": load_file(sd1_file), "callback": Payload()}, path)
    message = error_of(path)
    assert str(path) in message and "pickled" in message and "safetensors" in message
    assert not marker.exists()


def test_missing_tokenizer_says_what_to_provide(sd1_file, empty_hub_cache):
    message = error_of(sd1_file, tokenizer_path=None)
    assert sd1_file.name in message
    for needle in ("openai/clip-vit-large-patch14", "vocab.json", "tokenizer_path", "tokenizer_cache_dir"):  # fmt: skip
        assert needle in message


def test_tokenizer_path_without_files(sd1_file, tmp_path):
    message = error_of(sd1_file, tokenizer_path=str(tmp_path))
    assert f"tokenizer_path {tmp_path}" in message and "merges.txt" in message


def test_incomplete_file(sd1_file, tmp_path):
    tensors = load_file(sd1_file)
    path = tmp_path / "novae.safetensors"
    save_file({k: v for k, v in tensors.items() if not k.startswith("first_stage_model.")}, path)
    assert "has no VAE weights" in error_of(path)
    path = tmp_path / "hole.safetensors"
    hole = "model.diffusion_model.middle_block.1.proj_in.weight"
    save_file({k: v for k, v in tensors.items() if k != hole}, path)
    message = error_of(path)
    assert "cannot build the unet" in message and str(path) in message


def test_refiner_is_refused(tmp_path):
    path = tmp_path / "refiner.safetensors"
    save_file({"conditioner.embedders.0.model.ln_final.weight": torch.zeros(2)}, path)
    assert "SDXL refiner" in error_of(path)


def test_inpainting_model_is_refused(tmp_path):
    from diffusers import UNet2DConditionModel

    parts = build_tiny_components("sd1")
    unet = UNet2DConditionModel(**{**tiny_unet_config("sd1"), "in_channels": 9})
    path = write_single_file(
        tmp_path / "inpaint.safetensors", unet, parts["vae"], [parts["text_encoder"]], SD1,
        torch.float32,
    )  # fmt: skip
    assert "9 input channels" in error_of(path)


def test_missing_file(tmp_path):
    assert "does not exist" in error_of(tmp_path / "nope.safetensors")


def test_tokenizer_found_in_kohya_cache_dir_and_hub_cache(sd1_file, tmp_path, empty_hub_cache):
    kohya = tmp_path / "kohya"
    shutil.copytree(TOKENIZER, kohya / "openai_clip-vit-large-patch14")
    model = ModelSection(
        pretrained_model_name_or_path=str(sd1_file), tokenizer_cache_dir=str(kohya)
    )
    assert load_components(model, torch.float32).tokenizer.model_max_length == 77
    # The Hub cache layout: models--org--name/refs/main names the snapshot folder.
    repo = empty_hub_cache / "models--openai--clip-vit-large-patch14"
    shutil.copytree(TOKENIZER, repo / "snapshots" / "abc123")
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("abc123")
    model = ModelSection(pretrained_model_name_or_path=str(sd1_file))
    tokenizer = load_components(model, torch.float32).tokenizer
    assert Path(tokenizer.name_or_path) == repo / "snapshots" / "abc123"
