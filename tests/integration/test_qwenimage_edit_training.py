"""Qwen-Image-Edit end to end through the CLI: a musubi-tuner dataset config (image_directory,
control_directory, cache_directory, its older qwen_image_edit_control_resolution) trains an edit
LoRA on the tiny QwenImageEditPipeline folder, with the latents of images and references cached
and the captions' Qwen2.5-VL states cached by caption and reference (each pair encoded once,
however many epochs read it); diffusers' QwenImageEditPipeline applies the saved file exactly."""

from __future__ import annotations

import pytest
from PIL import Image

from library.models.families.qwenimage.family import QwenImageFamily
from tests.integration.harness import (
    assert_fuses_exactly,
    flat_toml_lines,
    make_images,
    tensors,
    train,
)
from tests.kits.qwenimage_edit.kit import transformers_processor
from tests.kits.qwenimage_edit.tiny import write_tiny_qwenimage_edit_folder

PREFIX = "diffusion_model."


@pytest.fixture(scope="module")
def edit_dir(tmp_path_factory):
    return write_tiny_qwenimage_edit_folder(tmp_path_factory.mktemp("models") / "tiny-edit")


@pytest.fixture(scope="module")
def edit_data(tmp_path_factory):
    """Two targets with captions of different lengths, each with its reference (the target
    mirrored, at 96x64)."""
    root = tmp_path_factory.mktemp("edit")
    targets = make_images(root / "targets", 2, size=64)
    (targets / "img01.txt").write_text(
        "a much longer instruction: mirror the shape, keep the colour"
    )
    controls = root / "controls"
    controls.mkdir()
    for target in sorted(targets.glob("*.png")):
        with Image.open(target) as image:
            image.transpose(0).resize((96, 64)).save(controls / target.name)
    return root


def _config(tmp_path, model_dir, root):
    dataset = root / "dataset.toml"
    dataset.write_text(
        "\n".join(
            [
                "[general]",
                "resolution = [256, 256]",
                'caption_extension = ".txt"',
                "batch_size = 1",
                "enable_bucket = true",
                "",
                "[[datasets]]",
                f'image_directory = "{root / "targets"}"',
                f'control_directory = "{root / "controls"}"',
                f'cache_directory = "{root / "cache"}"',
                "qwen_image_edit_control_resolution = [128, 128]",
                "num_repeats = 1",
            ]
        )
        + "\n",
        encoding="utf-8",
    )
    keys = {
        "pretrained_model_name_or_path": str(model_dir),
        "dataset_config": str(dataset),
        "output_dir": str(tmp_path / "out"),
        "output_name": "run",
        "network_module": "networks.lora_qwen_image",
        "network_train_unet_only": True,
        "network_dim": 4,
        "network_alpha": 2.0,
        "learning_rate": 1e-3,
        "max_train_steps": 4,
        "seed": 7,
        "cache_latents": True,
        "cache_text_encoder_outputs": True,
    }
    path = tmp_path / "c.toml"
    path.write_text("\n".join(flat_toml_lines(keys)) + "\n", encoding="utf-8")
    return path


def test_a_musubi_edit_dataset_trains_a_lora_diffusers_applies(
    tmp_path, edit_dir, edit_data, monkeypatch
):
    from diffusers import QwenImageEditPipeline

    encoded: list[list[str]] = []
    real = QwenImageFamily.encode_text_with_references

    def counting(self, tokenizers, text_encoders, captions, references, device):
        encoded.append(list(captions))
        return real(self, tokenizers, text_encoders, captions, references, device)

    monkeypatch.setattr(QwenImageFamily, "encode_text_with_references", counting)
    assert train(_config(tmp_path, edit_dir, edit_data)) == 0
    # 4 steps over 2 pairs (2 epochs): each caption read with its reference once
    assert sorted(c for batch in encoded for c in batch) == sorted(
        p.read_text() for p in (edit_data / "targets").glob("*.txt")
    )

    path = tmp_path / "out" / "run.safetensors"
    saved = tensors(path)
    modules = {k.rsplit(".", 2)[0] for k in saved if k.endswith(".weight")}
    module = f"{PREFIX}transformer_blocks.1.attn.add_k_proj"
    assert module in modules
    pipe = QwenImageEditPipeline.from_pretrained(
        edit_dir, processor=transformers_processor(edit_dir / "processor"), local_files_only=True
    )
    layer = pipe.transformer.get_submodule(module[len(PREFIX) :])
    assert_fuses_exactly(pipe, path, module, layer)


def test_accumulation_and_resume_with_references_train_the_same_lora(
    tmp_path, edit_dir, monkeypatch
):
    """Four targets, each with its reference and a caption of its own length, and the captions'
    states cached by caption and reference: one batch of 4, 2 x 2 accumulated, and a run
    stopped right after its step-1 save and resumed (its text cache refilled as it meets each
    pair) train the same LoRA."""
    from tests.integration.harness import (
        captioned_images,
        check_folder_lora_resumes,
        mirrored_references,
    )

    captions = ("red", "mirror it", "make the shape blue and keep the background",
                "turn the square into a circle on a soft gradient, same colours")  # fmt: skip
    images = captioned_images(tmp_path / "targets", captions)
    controls = mirrored_references(images, tmp_path / "controls")
    run = {"network_module": "networks.lora_qwen_image", "network_train_unet_only": True,
           "bucket_reso_steps": 16, "optimizer_args": ["eps=1e-3"],
           "cache_text_encoder_outputs": True}  # fmt: skip
    check_folder_lora_resumes(tmp_path, edit_dir, images, run, monkeypatch,
                              subset_keys={"control_directory": str(controls)})  # fmt: skip
