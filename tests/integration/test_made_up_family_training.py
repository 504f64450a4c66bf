"""A made-up family (tests/kits/toy/: a spec, a small family class and an entry; see
tests/models/test_made_up_family.py for its claims and loading) trains through the real CLI
once registered: the LoRA file holds kohya's module of every Linear of the spec's original
blocks (the names its table derives, and no other), every adapter moved, and the loss of the
training batch (fixed noise and sigmas) is lower with the file merged by hand than without."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

from library.config.flow_schema import FlowSection
from library.config.schema import ModelSection
from library.models.families import registry
from library.models.families.name_table import DUAL_STREAM_BLOCK, SINGLE_STREAM_BLOCK
from tests.integration.harness import make_images, tensors, train, write_config
from tests.kits.toy.entry import TOY_ENTRY
from tests.kits.toy.family import load_toy
from tests.kits.toy.spec import PAIRS, SOLOS, TABLE
from tests.kits.toy.tiny import tiny_transformer_config, write_tiny_toy_files, write_tiny_toy_folder

STEPS = 16
TOY = {
    "network_module": "networks.lora",
    "network_train_unet_only": True,
    "bucket_reso_steps": 16,
    "max_train_steps": STEPS,
    "train_batch_size": 2,
    "learning_rate": 1e-2,
    "model_prediction_type": "raw",  # the loss on the velocity, as _flow_loss writes it
}


@pytest.fixture
def folder(tmp_path):
    return write_tiny_toy_folder(tmp_path / "toy")


def _model(path) -> ModelSection:
    return ModelSection(pretrained_model_name_or_path=str(path))


def _expected_modules() -> set[str]:
    """kohya's module of every Linear of each original block, from the table's stems (the
    shared dual/single-stream ones and Toy's modulation Linears), counted off the tiny config."""
    config = tiny_transformer_config()
    lists = (
        (PAIRS, config["num_layers"], [*DUAL_STREAM_BLOCK, "img_mod.lin", "txt_mod.lin"]),
        (SOLOS, config["num_single_layers"], [*SINGLE_STREAM_BLOCK, "modulation.lin"]),
    )
    return {
        f"lora_unet_{name}_{i}_{stem.replace('.', '_')}"
        for name, count, stems in lists
        for i in range(count)
        for stem in stems
        if not stem.endswith(".scale")
    }


def _flow_loss(parts, transformer, batch: tuple[torch.Tensor, list[str]], noise, sigmas) -> float:
    """Rectified-flow loss written out: x_t = (1 - s) x0 + s noise, target noise - x0, x0 the
    VAE's posterior mode, shifted and scaled as its config says."""
    images, captions = batch
    family, vae = parts.family, parts.vae
    with torch.no_grad():
        mean = vae.encode(images).latent_dist.mode()
        latents = (mean - (vae.config.shift_factor or 0.0)) * vae.config.scaling_factor
        text = family.encode_text(parts.tokenizers, parts.text_encoders, captions, "cpu")
        cond = family.assemble_conditioning(text, None, "cpu")
        s = sigmas.view(-1, 1, 1, 1)
        pred = family.predict(transformer, (1 - s) * latents + s * noise, sigmas, cond)
        return torch.nn.functional.mse_loss(pred, noise - latents).item()


def _training_batch(folder) -> tuple[torch.Tensor, list[str]]:
    """The training images in [-1, 1] and their captions."""
    paths = sorted(folder.glob("*.png"))
    pixels = [np.asarray(Image.open(p).convert("RGB"), dtype=np.float32) for p in paths]
    images = torch.from_numpy(np.stack(pixels)).permute(0, 3, 1, 2) / 127.5 - 1
    return images, [p.with_suffix(".txt").read_text(encoding="utf-8") for p in paths]


def test_the_cli_trains_a_lora_in_the_spec_names(folder, tmp_path):
    images = make_images(tmp_path / "imgs", 2, size=64)
    out = tmp_path / "out"
    with registry.registered(TOY_ENTRY):
        assert train(write_config(tmp_path / "c.toml", folder, images, out, **TOY)) == 0
    saved = tensors(out / "run.safetensors")
    modules = {key.rsplit(".", 2)[0] if key.endswith(".weight") else key.rsplit(".", 1)[0]
               for key in saved}  # fmt: skip
    assert modules == _expected_modules()
    # the up factors start at zero: every one has moved
    ups = [key for key in saved if key.endswith(".lora_up.weight")]
    assert ups and all(saved[key].abs().sum() > 0 for key in ups)

    # The fixed batch's loss (the training images and captions, fixed noise and sigmas) is lower
    # with the LoRA merged by hand: W + alpha / r up @ down on each original fused tensor, split
    # into diffusers' Linears by the spec's table.
    parts = load_toy(_model(folder), FlowSection(), torch.float32, torch.float32)
    batch = _training_batch(images)
    noise = torch.randn(2, 16, 8, 8, generator=torch.Generator().manual_seed(0))
    sigmas = torch.tensor([0.3, 0.7])
    before = _flow_loss(parts, parts.denoiser, batch, noise, sigmas)
    original = TABLE.to_original(parts.denoiser.state_dict())
    for module in {key.rsplit(".", 2)[0] for key in ups}:
        down, up = saved[f"{module}.lora_down.weight"], saved[f"{module}.lora_up.weight"]
        stem = module.removeprefix("lora_unet_")
        name = next(k for k in original if k.replace(".", "_") == f"{stem}_weight")
        original[name] = original[name] + saved[f"{module}.alpha"] / down.shape[0] * (up @ down)
    parts.denoiser.load_state_dict(TABLE.from_original(original))
    after = _flow_loss(parts, parts.denoiser, batch, noise, sigmas)
    assert after < before, (before, after)


def test_a_full_fine_tune_is_written_in_the_original_names(folder, tmp_path):
    """The trained transformer is written as the spec's main file (the table's original names,
    every key of the tiny original file and no other), and the shared loader reads it back as
    the trained diffusers transformer written beside it."""
    from diffusers import BriaTransformer2DModel

    images = make_images(tmp_path / "imgs", 2, size=64)
    out = tmp_path / "out"
    keys = {**TOY, "train_mode": "unet", "learning_rate": 1e-4, "max_train_steps": 2}
    for key in ("network_module", "network_train_unet_only"):
        keys.pop(key)
    with registry.registered(TOY_ENTRY):
        assert train(write_config(tmp_path / "c.toml", folder, images, out, **keys)) == 0
    files = write_tiny_toy_files(tmp_path / "files")
    saved = tensors(out / "run.safetensors")
    assert set(saved) == set(tensors(files["transformer"]))
    assert f"{PAIRS}.0.img_attn.qkv.weight" in saved and f"{SOLOS}.0.linear1.weight" in saved
    flow = FlowSection(t5xxl=str(files["t5xxl"]), ae=str(files["ae"]),
                       t5_tokenizer_path=str(files["t5_tokenizer"]))  # fmt: skip
    reread = load_toy(_model(out / "run.safetensors"), flow, torch.float32, torch.float32)
    trained = BriaTransformer2DModel.from_pretrained(out / "run" / "transformer").state_dict()
    base = BriaTransformer2DModel.from_pretrained(folder / "transformer").state_dict()
    assert any(not torch.equal(base[k], v) for k, v in trained.items())  # it trained
    for key, value in reread.denoiser.state_dict().items():
        assert torch.equal(value, trained[key]), key
