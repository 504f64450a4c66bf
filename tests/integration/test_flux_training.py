"""FLUX.1 end to end through the CLI on tiny models: LoRA from a diffusers folder and from the
single files users have (with fp8_base, fp8-stored files and ComfyUI's scaled fp8 files),
cached text and latents, kohya's Flux names in the saved file, text-encoder adapters, a full
fine-tune and its two outputs, accumulation and resume equivalence."""

from __future__ import annotations

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from tests.integration.harness import (
    check_accumulation_and_resume,
    make_images,
    tensors,
    train,
    write_config,
)
from tests.kits.flux.tiny_files import write_tiny_flux_files
from tests.kits.scaled_fp8 import scaled

FLUX = {
    "network_module": "networks.lora_flux",
    "network_train_unet_only": True,
    "timestep_sampling": "shift",
    "model_prediction_type": "raw",
    "guidance_scale": 1.0,
    "bucket_reso_steps": 16,
}


@pytest.fixture(scope="module")
def flux_dir(kit_folders):
    """The session's tiny kit folder (flux dev, seed 0): read only."""
    return kit_folders("flux", "dev")


@pytest.fixture(scope="module")
def flux_files(tmp_path_factory):
    return write_tiny_flux_files(tmp_path_factory.mktemp("flux-files"), "dev", seed=0, fp8=True)


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    return make_images(tmp_path_factory.mktemp("data") / "imgs", 4, size=64)


def _config(tmp_path, model, images, out, **keys):
    return write_config(tmp_path / "c.toml", model, images, out, resolution=64,
                        **{**FLUX, **keys})  # fmt: skip


def test_flux_lora_from_a_folder_saves_kohyas_names(tmp_path, flux_dir, images):
    out = tmp_path / "out"
    config = _config(tmp_path, flux_dir, images, out, max_train_steps=3,
                     cache_latents=True, cache_text_encoder_outputs=True)  # fmt: skip
    assert train(config) == 0
    path = out / "run.safetensors"
    saved = tensors(path)
    names = {k.split(".")[0] for k in saved}
    # 2 double blocks x 10 + 2 single blocks x 3 kohya modules (tiny model)
    assert len(names) == 2 * 10 + 2 * 3
    assert "lora_unet_double_blocks_1_txt_attn_qkv" in names
    assert "lora_unet_single_blocks_0_linear1" in names
    ups = [v for k, v in saved.items() if k.endswith("lora_up.weight")]
    assert any(v.abs().max() > 0 for v in ups)  # it trained
    with safe_open(str(path), "pt") as f:
        meta = f.metadata()
    assert meta["ss_base_model_version"] == "flux1"
    assert meta["modelspec.architecture"] == "flux-1-dev/lora"
    assert meta["modelspec.implementation"] == "https://github.com/black-forest-labs/flux"
    assert "modelspec.prediction_type" not in meta
    # kohya's Flux.1 keys: the settings of this run, kohya's defaults for the rest
    assert (meta["ss_timestep_sampling"], meta["ss_model_prediction_type"]) == ("shift", "raw")
    assert (meta["ss_guidance_scale"], meta["ss_discrete_flow_shift"]) == ("1.0", "3.0")
    assert (meta["ss_weighting_scheme"], meta["ss_model_type"]) == ("uniform", "flux")


@pytest.mark.parametrize("stored", ["fp8", "scaled fp8"])
def test_flux_lora_from_single_fp8_files_with_fp8_base(
    tmp_path, flux_files, images, capsys, stored
):
    """Plain fp8 files, and ComfyUI's scaled fp8 ones (the transformer in the comfy_quant
    layout, t5xxl in the scaled_fp8 one, whose dry run prints the plan): the LoRA trains with
    fp8_base."""
    files = dict(flux_files)
    if stored == "scaled fp8":
        for role, layout in (("transformer", "comfy_quant"), ("t5xxl", "scaled_fp8")):
            files[role] = tmp_path / f"{role}_fp8_scaled.safetensors"
            save_file(scaled(load_file(str(flux_files[role])), layout)[0], str(files[role]))
    out = tmp_path / "out"
    config = _config(
        tmp_path, files["transformer"], images, out, max_train_steps=2,
        clip_l=str(files["clip_l"]), t5xxl=str(files["t5xxl"]),
        ae=str(files["ae"]), tokenizer_path=str(files["tokenizer"]),
        t5_tokenizer_path=str(files["t5_tokenizer"]), fp8_base=True,
    )  # fmt: skip
    if stored == "scaled fp8":
        assert train(config, "--dry_run") == 0
        assert "model: FLUX.1 dev" in capsys.readouterr().out and not out.exists()
    assert train(config) == 0
    saved = tensors(out / "run.safetensors")
    assert any(k.startswith("lora_unet_double_blocks_0_img_attn_qkv.") for k in saved)


def test_full_fine_tune_saves_the_transformer_file_and_a_folder(tmp_path, flux_dir, images):
    """train_mode = "unet" on FLUX.1: the transformer alone in Black Forest Labs' layout (what
    users load as flux1-dev.safetensors) and, the base being a folder, a diffusers folder; both
    hold the same trained weights, which diffusers' FluxPipeline and our loader read back."""
    from diffusers import FluxPipeline

    from library.config.flow_schema import FlowSection
    from library.config.schema import ModelSection
    from library.models.families.flux.original_keys import detect_flux
    from library.models.loader import load_components

    out = tmp_path / "out"
    config = _config(tmp_path, flux_dir, images, out, max_train_steps=2, train_mode="unet",
                     learning_rate=1e-4, network_module="networks.lora")  # fmt: skip
    assert train(config) == 0
    file = out / "run.safetensors"
    with safe_open(str(file), "pt") as f:
        keys, meta = list(f.keys()), f.metadata()
    found = detect_flux(keys)
    assert found is not None and found.layout == "original" and found.variant == "dev"
    assert meta["modelspec.architecture"] == "flux-1-dev"
    assert meta["modelspec.implementation"] == "https://github.com/black-forest-labs/flux"
    folder = FluxPipeline.from_pretrained(out / "run").transformer.state_dict()
    base = FluxPipeline.from_pretrained(flux_dir).transformer.state_dict()
    assert any(not torch.equal(folder[k], base[k]) for k in base)  # it trained
    parts = write_tiny_flux_files(tmp_path / "files", "dev", seed=0)  # the folder's CLIP/T5/AE
    model = ModelSection(pretrained_model_name_or_path=str(file),
                         tokenizer_path=str(parts["tokenizer"]))  # fmt: skip
    flow = FlowSection(clip_l=str(parts["clip_l"]), t5xxl=str(parts["t5xxl"]),
                       ae=str(parts["ae"]), t5_tokenizer_path=str(parts["t5_tokenizer"]))  # fmt: skip
    loaded = load_components(model, torch.float32, flow).denoiser.state_dict()
    assert loaded.keys() == folder.keys()
    for key, value in folder.items():
        torch.testing.assert_close(loaded[key], value, rtol=0, atol=0)


def test_text_encoder_adapters_train_with_the_transformer(tmp_path, flux_dir, images):
    """CLIP-L and (train_t5xxl) T5 adapters train beside the transformer's, under kohya's names."""
    out = tmp_path / "out"
    config = _config(tmp_path, flux_dir, images, out, max_train_steps=2,
                     network_train_unet_only=False, network_args=["train_t5xxl=True"],
                     text_encoder_lr=[1e-3, 5e-4])  # fmt: skip
    assert train(config) == 0
    saved = tensors(out / "run.safetensors")
    for prefix in ("lora_unet_", "lora_te1_", "lora_te3_"):
        ups = [v for k, v in saved.items() if k.startswith(prefix) and k.endswith("lora_up.weight")]
        assert ups and max(v.abs().max().item() for v in ups) > 0, prefix


def test_accumulation_and_resume_train_the_same_lora(tmp_path, flux_dir, images, monkeypatch):
    """4 samples per step as one batch of 4, as 2 x 2 accumulated, and stopped and resumed."""

    def make_config(folder, out, **keys):
        return _config(folder, flux_dir, images, out, **keys)

    common = {"max_train_steps": 2, "train_batch_size": 4}
    check_accumulation_and_resume(tmp_path, make_config, common, monkeypatch)
