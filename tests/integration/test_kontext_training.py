"""FLUX.1 Kontext end to end through the CLI: a musubi-tuner dataset config (image_directory,
control_directory, cache_directory, [general]) trains an edit LoRA unchanged on the tiny
FluxKontextPipeline folder, with cached latents of the images and their references; the file
is one diffusers' FluxKontextPipeline applies. A text-to-image model given reference images,
and an edit model given none, are refused before anything loads."""

from __future__ import annotations

import pytest
import torch
from PIL import Image

from tests.integration.harness import (
    assert_fuses_exactly,
    flat_toml_lines,
    make_images,
    tensors,
    train,
)

RUN = {
    "network_module": "networks.lora_flux",
    "network_train_unet_only": True,
    "max_train_steps": 2,
    "learning_rate": 1e-3,
    "network_dim": 4,
    "network_alpha": 2.0,
    "seed": 7,
    "guidance_scale": 1.0,
    "cache_latents": True,
    "cache_latents_to_disk": True,
    # diffusers' kohya reader splits a single block's fused linear1 at FLUX.1's full width, so
    # the tiny model's can only be read there through the conformance suite's patched converter
    "train_blocks": "double",
}


@pytest.fixture(scope="module")
def kontext_dir(kit_folders):
    return kit_folders("flux_kontext", "dev")


@pytest.fixture(scope="module")
def edit_data(tmp_path_factory):
    """Two targets with captions, and each one's reference: the target mirrored, at 128x64."""
    root = tmp_path_factory.mktemp("edit")
    targets = make_images(root / "targets", 2, size=64)
    controls = root / "controls"
    controls.mkdir()
    for target in sorted(targets.glob("*.png")):
        with Image.open(target) as image:
            image.transpose(0).resize((128, 64)).save(controls / target.name)
    return root


def _musubi_dataset(root, name="dataset.toml", **extra) -> str:
    """A dataset config as musubi-tuner's docs write one for an edit model."""
    lines = [
        "[general]",
        "resolution = [256, 256]",
        'caption_extension = ".txt"',
        "batch_size = 2",
        "enable_bucket = true",
        "bucket_no_upscale = false",
        "",
        "[[datasets]]",
        f'image_directory = "{root / "targets"}"',
        f'control_directory = "{root / "controls"}"',
        f'cache_directory = "{root / "cache"}"',
        "num_repeats = 1",
        *(f"{key} = {value}" for key, value in extra.items()),
    ]
    path = root / name
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return str(path)


def _config(path, model_dir, dataset, output_dir, **keys):
    values = {"pretrained_model_name_or_path": str(model_dir), "output_dir": str(output_dir),
              "output_name": "run", "dataset_config": dataset, **RUN, **keys}  # fmt: skip
    path.write_text("\n".join(flat_toml_lines(values)) + "\n", encoding="utf-8")
    return path


def test_a_musubi_edit_dataset_trains_a_lora_diffusers_applies(
    tmp_path, kontext_dir, edit_data, monkeypatch
):
    from diffusers import FluxKontextPipeline

    from library.training import trainer

    batches: list = []
    real = trainer.micro_batch_loss

    def recording(inputs, batch):
        batches.append(batch)
        return real(inputs, batch)

    monkeypatch.setattr(trainer, "micro_batch_loss", recording)
    dataset = _musubi_dataset(edit_data, no_resize_control="true")
    out = tmp_path / "out"
    assert train(_config(tmp_path / "c.toml", kontext_dir, dataset, out)) == 0

    first = batches[0]
    (means,) = first["reference_means"]  # the references' cached latents, at their own size
    assert means.shape == (2, 16, 8, 16)
    assert first["latent_means"].shape == (2, 16, 32, 32)
    assert any((edit_data / "cache").iterdir())  # musubi-tuner's cache_directory is used

    path = out / "run.safetensors"
    assert any(k.startswith("lora_unet_double_blocks_0_img_attn_qkv") for k in tensors(path))
    pipe = FluxKontextPipeline.from_pretrained(kontext_dir, local_files_only=True)
    layer = pipe.transformer.transformer_blocks[0].attn.to_out[0]
    assert_fuses_exactly(pipe, path, "lora_unet_double_blocks_0_img_attn_proj", layer)


def test_the_dry_run_plans_the_references_and_counts_their_tokens(
    tmp_path, kontext_dir, edit_data, capsys
):
    import json

    dataset = _musubi_dataset(edit_data, no_resize_control="true")
    config = _config(tmp_path / "c.toml", kontext_dir, dataset, tmp_path / "o")
    assert train(config, "--dry_run", "--json") == 0
    plan = json.loads(capsys.readouterr().out)
    (subset,) = plan["datasets"][0]["subsets"]
    assert subset["reference_images"] == 2 and subset["references_from"].endswith("controls")
    (bucket,) = plan["datasets"][0]["buckets"]
    assert bucket["references"] == [[128, 64]]
    # the estimate counts the reference tokens: references resized to the 256x256 bucket (4
    # times the 128x64 ones' tokens) give a larger one
    estimate = plan["memory"]["peak_bytes"]
    resized = _musubi_dataset(edit_data, "resized.toml")
    config = _config(tmp_path / "c2.toml", kontext_dir, resized, tmp_path / "o")
    assert train(config, "--dry_run", "--json") == 0
    assert json.loads(capsys.readouterr().out)["memory"]["peak_bytes"] > estimate


def test_reference_images_and_models_must_agree_before_loading(
    tmp_path, kontext_dir, edit_data, capsys, kit_folders
):
    flux_dir = kit_folders("flux", "dev")
    dataset = _musubi_dataset(edit_data)
    config = _config(tmp_path / "t2i.toml", flux_dir, dataset, tmp_path / "o1")
    assert train(config) == 2
    assert "a FLUX.1 model learns from images alone, not from reference images" in (
        capsys.readouterr().err
    )
    plain = edit_data / "plain.toml"
    plain.write_text(
        f'[[datasets]]\nresolution = 64\n[[datasets.subsets]]\nimage_dir = "{edit_data / "targets"}"\n',
        encoding="utf-8",
    )
    config = _config(tmp_path / "edit.toml", kontext_dir, str(plain), tmp_path / "o2")
    assert train(config) == 2
    err = capsys.readouterr().err
    assert "learns each image with 1 reference image; set control_directory" in err


def test_a_full_fine_tune_writes_the_kontext_transformer_file_and_folder(
    tmp_path, kontext_dir, edit_data
):
    """train_mode = "unet" on FLUX.1 Kontext with references: the transformer file in Black
    Forest Labs' layout (flux1-kontext-dev.safetensors' names) and, the base being a folder, a
    FluxKontextPipeline folder diffusers reads, holding the trained weights the file holds."""
    from diffusers import FluxKontextPipeline

    from library.models.families.flux.original_keys import transformer_to_original

    out = tmp_path / "out"
    dataset = _musubi_dataset(edit_data)
    config = _config(tmp_path / "c.toml", kontext_dir, dataset, out, train_mode="unet",
                     learning_rate=1e-4, save_precision="float")  # fmt: skip
    assert train(config) == 0
    trained = FluxKontextPipeline.from_pretrained(out / "run").transformer.state_dict()
    base = FluxKontextPipeline.from_pretrained(kontext_dir).transformer.state_dict()
    assert any(not torch.equal(trained[k], base[k]) for k in base)  # it trained
    saved = tensors(out / "run.safetensors")
    expected = transformer_to_original(trained)
    assert saved.keys() == expected.keys()
    assert all(torch.equal(saved[k], v) for k, v in expected.items())


def test_accumulation_and_resume_with_references_train_the_same_lora(
    tmp_path, kontext_dir, monkeypatch
):
    """Four targets, each with its reference (mirrored, at the target's size): one batch of 4,
    2 x 2 accumulated, and a run stopped right after its step-1 save and resumed train the
    same LoRA."""
    from tests.integration.harness import check_folder_lora_resumes, mirrored_references

    images = make_images(tmp_path / "targets", 4, size=64)
    controls = mirrored_references(images, tmp_path / "controls")
    run = {**RUN, "optimizer_args": ["eps=1e-3"], "bucket_reso_steps": 16}
    check_folder_lora_resumes(tmp_path, kontext_dir, images, run, monkeypatch,
                              subset_keys={"control_directory": str(controls)})  # fmt: skip
