"""FLUX.2 end to end through the CLI on the tiny Flux2KleinPipeline folder: a full fine-tune
writes the trained transformer in Black Forest Labs' names (what diffusers' converter and our
single-file loader read back exactly); a dev LoRA trains from the single files and samples; the
dry run estimates memory."""

from __future__ import annotations

import pytest
import torch
from safetensors import safe_open

from tests.integration.harness import make_images, tensors, train, write_config
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
