"""FLUX.2 end to end through the CLI on the tiny Flux2KleinPipeline folder: a full fine-tune
writes the trained transformer in Black Forest Labs' names (what diffusers' converter and our
single-file loader read back exactly); a dev LoRA trains from the single files and samples; the
dry run estimates memory."""

from __future__ import annotations

import pytest
import torch
from safetensors import safe_open

from tests.integration.harness import flat_toml_lines, make_images, tensors, train, write_config
from tests.kits.flux2.tiny_files import write_tiny_flux2_files

FLUX2 = {"network_module": "networks.lora_flux_2", "network_train_unet_only": True,
         "bucket_reso_steps": 16, "max_train_steps": 2}  # fmt: skip


@pytest.fixture(scope="module")
def folder(kit_folders):
    return kit_folders("flux2", "klein-base")


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    return make_images(tmp_path_factory.mktemp("data") / "imgs", 2, size=64)


def test_full_fine_tune_writes_the_trained_transformer_in_the_original_names(
    tmp_path, folder, images, monkeypatch
):
    from diffusers.loaders.single_file_utils import (
        convert_flux2_transformer_checkpoint_to_diffusers,
    )

    from library.models.families.flux2.family import Flux2Family

    trained = {}
    real = Flux2Family.write_full_model

    def recording(self, path, denoiser, *args):
        trained.update({k: v.detach().clone() for k, v in denoiser.state_dict().items()})
        return real(self, path, denoiser, *args)

    monkeypatch.setattr(Flux2Family, "write_full_model", recording)
    out = tmp_path / "out"
    config = write_config(tmp_path / "c.toml", folder, images, out, train_mode="unet",
                          learning_rate=1e-4, save_precision="float", bucket_reso_steps=16,
                          max_train_steps=2)  # fmt: skip
    assert train(config) == 0
    path = out / "run.safetensors"
    saved = tensors(path)
    assert "double_blocks.0.img_attn.qkv.weight" in saved
    converted = convert_flux2_transformer_checkpoint_to_diffusers(dict(saved))
    assert converted.keys() == trained.keys()
    assert all(torch.equal(converted[k], v) for k, v in trained.items())
    with safe_open(str(path), "pt") as f:
        assert f.metadata()["difftune.flux2.distilled"] == "false"


def test_a_dev_lora_trains_from_single_files_and_samples_during_training(tmp_path, images):
    """dev's files (Black Forest Labs' transformer, Comfy-Org's Mistral 3 file): every path
    klein's files take through the run, and the guidance input and the language model alone
    sampling through Flux2Pipeline (klein's files load as its folder: tests/conformance)."""
    files = write_tiny_flux2_files(tmp_path / "files", "dev")
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("a red cube --w 64 --h 80 --s 2\n", encoding="utf-8")
    out = tmp_path / "out"
    config = write_config(tmp_path / "c.toml", files["transformer"], images, out, **FLUX2,
                          tokenizer_path=str(files["tokenizer"]), vae=str(files["vae"]),
                          text_encoder=str(files["text_encoder"]), sample_prompts=str(prompts),
                          sample_every_n_steps=2)  # fmt: skip
    assert train(config) == 0
    saved = tensors(out / "run.safetensors")
    assert all(
        k.startswith(("lora_unet_double_blocks_", "lora_unet_single_blocks_")) for k in saved
    )
    assert any(v.abs().max() > 0 for k, v in saved.items() if k.endswith("lora_up.weight"))
    from PIL import Image

    samples = sorted((out / "sample").glob("*.png"))
    assert samples and Image.open(samples[0]).size == (64, 80)


def test_the_dry_run_estimates_memory(tmp_path, folder, images, capfd):
    config = write_config(tmp_path / "c.toml", folder, images, tmp_path / "out", **FLUX2)
    assert train(config, "--dry_run") == 0
    out, err = capfd.readouterr()
    text = out + err
    assert "memory: not estimated" not in text and "  memory: about " in text


def test_a_musubi_tuner_klein_args_file_passes_the_dry_run(tmp_path, images, capfd):
    """As a user arrives from musubi-tuner: its FLUX.2 guide's training options in an args file
    (model_version, its suggested flux2_shift draw, its LoRA module) beside the tiny klein
    base files; difftune adds only the tokenizer folder musubi-tuner would download."""
    files = write_tiny_flux2_files(tmp_path / "files")
    dataset = tmp_path / "dataset.toml"
    dataset.write_text(f'[general]\nresolution = [64, 64]\ncaption_extension = ".txt"\n'
                       f'batch_size = 1\nenable_bucket = true\n\n[[datasets]]\n'
                       f'image_directory = "{images}"\ncache_directory = "{tmp_path / "cache"}"\n',
                       encoding="utf-8")  # fmt: skip
    args = {"model_version": "klein-base-4b", "dit": files["transformer"], "vae": files["vae"],
            "text_encoder": files["text_encoder"], "tokenizer_path": files["tokenizer"],
            "dataset_config": dataset, "sdpa": True, "mixed_precision": "bf16",
            "timestep_sampling": "flux2_shift", "weighting_scheme": "none",
            "optimizer_type": "adamw8bit", "learning_rate": 1e-4, "gradient_checkpointing": True,
            "network_module": "networks.lora_flux_2", "network_dim": 32, "max_train_epochs": 16,
            "save_every_n_epochs": 1, "seed": 42, "output_dir": tmp_path / "out",
            "output_name": "name-of-lora"}  # fmt: skip
    config = tmp_path / "args.toml"
    config.write_text("\n".join(flat_toml_lines(args)) + "\n", encoding="utf-8")
    assert train(config, "--dry_run") == 0
    out, err = capfd.readouterr()
    assert "base; rectified flow, velocity target at timestep sigma, timestep_sampling " \
           "flux2_shift" in out + err  # fmt: skip
