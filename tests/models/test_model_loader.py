"""Loading tiny diffusers folders: family, scheduler, dtype, freezing, and every error case."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

from library.config.schema import ModelSection
from library.errors import ModelError
from library.models.families.sd.family import SD1, SD2, SD2_V
from library.models.loader import load_components
from library.models.model_files import model_fingerprint


def load(path, dtype=torch.float32, **flags):
    return load_components(ModelSection(pretrained_model_name_or_path=str(path), **flags), dtype)


@pytest.fixture(scope="module")
def sd1(tiny_model_dir):
    return load(tiny_model_dir)


@pytest.fixture
def broken_copy(tiny_model_dir, tmp_path) -> Path:
    """A private copy of the tiny model that a test may damage."""
    return Path(shutil.copytree(tiny_model_dir, tmp_path / "model"))


def test_sd1_folder_loads_as_sd1_epsilon(sd1, tiny_model_dir):
    from diffusers import DDPMScheduler

    assert sd1.family is SD1
    assert isinstance(sd1.objective.scheduler, DDPMScheduler)
    assert sd1.objective.scheduler.config.prediction_type == "epsilon"
    assert sd1.model_dir == Path(tiny_model_dir).absolute()
    assert sd1.tokenizer.model_max_length == 77
    assert sd1.text_encoders == (sd1.text_encoder,)


def test_scheduler_has_the_models_beta_schedule(sd1):
    # scaled_linear: betas are squares of a linear ramp between the square roots (float64 here).
    cfg = sd1.objective.scheduler.config
    assert (cfg.beta_start, cfg.beta_end, cfg.num_train_timesteps) == (0.00085, 0.012, 1000)
    ramp = torch.linspace(0.00085**0.5, 0.012**0.5, 1000, dtype=torch.float64)
    expected = torch.cumprod(1.0 - ramp**2, dim=0)
    got = sd1.objective.scheduler.alphas_cumprod.to(torch.float64)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-7)


def test_weights_equal_the_saved_files(sd1, tiny_model_dir):
    from safetensors.torch import load_file

    saved = load_file(Path(tiny_model_dir) / "unet" / "diffusion_pytorch_model.safetensors")
    state = sd1.denoiser.state_dict()
    assert saved.keys() == state.keys()
    for key, tensor in saved.items():
        assert torch.equal(state[key], tensor), key


def test_sd2v_folder_loads_as_sd2_v(tiny_sd2v_model_dir):
    parts = load(tiny_sd2v_model_dir)
    assert parts.family is SD2_V
    assert parts.objective.scheduler.config.prediction_type == "v_prediction"


def test_flags_override_the_folder(tiny_sd2v_model_dir):
    parts = load(tiny_sd2v_model_dir, v2=True, v_parameterization=False)
    assert parts.family is SD2
    assert parts.objective.scheduler.config.prediction_type == "epsilon"
    parts = load(tiny_sd2v_model_dir, v2=False, v_parameterization=False)
    assert parts.family is SD1


def test_weight_dtype_and_frozen(tiny_model_dir):
    parts = load(tiny_model_dir, torch.bfloat16)
    modules = {"unet": parts.denoiser, "vae": parts.vae, "text_encoder": parts.text_encoder}
    for name, module in modules.items():
        params = list(module.parameters())
        assert params, name
        assert {p.dtype for p in params} == {torch.bfloat16}, name
        assert not any(p.requires_grad for p in params), name
        floating = [b for b in module.buffers() if b.is_floating_point()]
        assert all(b.dtype == torch.bfloat16 for b in floating), name


def test_fingerprint_is_the_folder_name(tiny_model_dir):
    assert model_fingerprint(tiny_model_dir) == Path(tiny_model_dir).name
    assert model_fingerprint(str(tiny_model_dir) + "/") == Path(tiny_model_dir).name


def expect_model_error(path, *needles: str) -> str:
    with pytest.raises(ModelError) as info:
        load(path)
    message = str(info.value)
    assert "\n" not in message
    for needle in needles:
        assert needle in message, message
    return message


def test_missing_folder(tmp_path):
    expect_model_error(tmp_path / "nope", str(tmp_path / "nope"), "does not exist")


@pytest.mark.parametrize("name", ["model.safetensors", "model.ckpt"])
def test_garbage_single_file_checkpoint(tmp_path, name):
    # Single files load through library/models/families/sd/single_file.py
    # (tests/models/test_single_file*).
    path = tmp_path / name
    path.write_bytes(b"\0" * 16)
    expect_model_error(path, str(path), "corrupt or truncated")


def test_other_file_is_not_a_model(tmp_path):
    path = tmp_path / "model.txt"
    path.write_text("x")
    expect_model_error(path, str(path), "neither a diffusers folder nor")


def test_folder_without_model_index(broken_copy):
    (broken_copy / "model_index.json").unlink()
    expect_model_error(broken_copy, str(broken_copy), "model_index.json")


@pytest.mark.parametrize("sub", ["unet", "vae", "text_encoder", "tokenizer", "scheduler"])
def test_missing_component_subfolder(broken_copy, sub):
    shutil.rmtree(broken_copy / sub)
    expect_model_error(broken_copy, str(broken_copy), f"{sub}/")


def test_tokenizer_without_vocab(broken_copy):
    for name in ("vocab.json", "tokenizer.json"):
        (broken_copy / "tokenizer" / name).unlink()
    expect_model_error(broken_copy, str(broken_copy / "tokenizer"), "vocab.json")


@pytest.mark.parametrize(
    "rel", ["unet/diffusion_pytorch_model.safetensors", "text_encoder/model.safetensors"]
)
def test_truncated_weights_file(broken_copy, rel):
    file = broken_copy / rel
    data = file.read_bytes()
    file.write_bytes(data[: len(data) // 2])
    expect_model_error(broken_copy, str(file), "corrupt or truncated")


def test_missing_weights_file(broken_copy):
    (broken_copy / "vae" / "diffusion_pytorch_model.safetensors").unlink()
    expect_model_error(broken_copy, str(broken_copy / "vae"), "no weights file")


def test_corrupt_config_json(broken_copy):
    (broken_copy / "unet" / "config.json").write_text("{not json", encoding="utf-8")
    expect_model_error(broken_copy, str(broken_copy / "unet" / "config.json"))


def test_sdxl_folder_needs_its_second_text_encoder(broken_copy):
    import json

    index_path = broken_copy / "model_index.json"
    index = json.loads(index_path.read_text())
    index["text_encoder_2"] = ["transformers", "CLIPTextModelWithProjection"]
    index_path.write_text(json.dumps(index))
    expect_model_error(broken_copy, "lacks the text_encoder_2/ subfolder")


def test_fp16_variant_only_folder_loads(broken_copy):
    # Folders downloaded with variant="fp16" hold only *.fp16.safetensors files.
    for rel in (
        "unet/diffusion_pytorch_model",
        "vae/diffusion_pytorch_model",
        "text_encoder/model",
    ):
        src = broken_copy / f"{rel}.safetensors"
        src.rename(broken_copy / f"{rel}.fp16.safetensors")
    parts = load(broken_copy)
    assert parts.family is SD1
