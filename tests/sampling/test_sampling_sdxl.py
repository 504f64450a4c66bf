"""SDXL samples: the family's conditioning, the live UNet and both live text encoders."""

from __future__ import annotations

import copy
import random

import numpy as np
import pytest
import torch
from sampling_helpers import pixels, prompt

import library.sampling.generate as generate
from library.config.schema import ModelSection
from library.models.loader import load_components
from library.networks.lora import LoraSpec, apply_lora, lora_parameters, randomize_lora
from library.sampling.generate import sample_images


def load_sdxl(model_dir, v_parameterization=None):
    section = ModelSection(
        pretrained_model_name_or_path=str(model_dir), v_parameterization=v_parameterization
    )
    return load_components(section, torch.float32)


@pytest.fixture
def sdxl(tiny_sdxl_model_dir):
    """The tiny SDXL model, loaded fresh (tests inject adapters and flip modes)."""
    return load_sdxl(tiny_sdxl_model_dir)


def run(components, prompts, tmp_path, step=7, **kw):
    return sample_images(
        components, prompts, step=step, output_dir=tmp_path / "out", output_name="run", **kw
    )


def image(components, p, tmp_path, step, **kw):
    (path,) = run(components, [p], tmp_path, step=step, **kw).images
    return pixels(path)


def test_names_sizes_and_grid(sdxl, tmp_path):
    prompts = [prompt(0), prompt(1, width=96, seed=5, sampler="euler_a"), prompt(2, height=80)]
    result = run(sdxl, prompts, tmp_path, step=12)
    folder = tmp_path / "out" / "sample"
    names = ["run_000012_00_100.png", "run_000012_01_5.png", "run_000012_02_102.png"]
    assert result.images == [folder / n for n in names]
    assert sorted(p.name for p in folder.iterdir()) == sorted(names + ["run_000012_grid.png"])
    shapes = [pixels(folder / n).shape for n in names]
    assert shapes == [(64, 64, 3), (64, 96, 3), (80, 64, 3)]
    grid = pixels(result.grid)
    assert grid.shape == (160, 192, 3)  # 2 x 2 cells of 96 x 80
    assert (grid[:64, 96:] == pixels(folder / names[1])).all()
    assert (grid[80:, :64] == pixels(folder / names[2])).all()


def test_unet_lora_changes_the_image_under_the_same_seed(sdxl, tmp_path):
    p = prompt(0, sampler="euler_a")
    plain = image(sdxl, p, tmp_path, 1)
    apply_lora(sdxl.denoiser, "unet", LoraSpec(dim=4, alpha=4))
    assert (image(sdxl, p, tmp_path, 2) == plain).all()  # a fresh adapter (up = 0)
    randomize_lora(sdxl.denoiser, torch.Generator().manual_seed(0), std=0.5)
    assert np.abs(image(sdxl, p, tmp_path, 3) - plain).mean() > 1
    with torch.no_grad():  # edit the live weights in place: the next round must show it
        for param in lora_parameters(sdxl.denoiser):
            param.zero_()
    assert (image(sdxl, p, tmp_path, 4) == plain).all()


@pytest.mark.parametrize("which", [0, 1])
def test_each_live_text_encoder_reaches_the_image(sdxl, tmp_path, which):
    p = prompt(0)
    plain = image(sdxl, p, tmp_path, 1)
    encoder = sdxl.text_encoders[which]
    apply_lora(encoder, "text_encoder", LoraSpec(dim=4, alpha=4))
    randomize_lora(encoder, torch.Generator().manual_seed(1), std=0.5)
    assert np.abs(image(sdxl, p, tmp_path, 2) - plain).mean() > 1


def test_prepared_modules_replace_the_components_own(sdxl, tmp_path):
    """What the trainer passes as ``prepared`` (by module name) is what samples."""
    p = prompt(0)
    other = copy.deepcopy(sdxl.text_encoders[1])
    with torch.no_grad():
        for param in other.parameters():
            param.add_(torch.randn(param.shape, generator=torch.Generator().manual_seed(2)) * 0.2)
    plain = image(sdxl, p, tmp_path, 1)
    via_prepared = image(sdxl, p, tmp_path, 2, prepared={"text_encoder_2": other})
    sdxl.text_encoders = (sdxl.text_encoders[0], other)
    swapped = image(sdxl, p, tmp_path, 3)
    assert (via_prepared == swapped).all()
    assert np.abs(via_prepared - plain).mean() > 1


def test_rng_states_modes_and_gradients_are_restored(sdxl, tmp_path, monkeypatch):
    apply_lora(sdxl.denoiser, "unet", LoraSpec(dim=4, alpha=4))
    apply_lora(sdxl.text_encoders[1], "text_encoder", LoraSpec(dim=4, alpha=4))
    modules = [sdxl.denoiser, sdxl.text_encoder, sdxl.text_encoders[1]]
    sdxl.denoiser.train()
    sdxl.text_encoders[1].train()
    list(sdxl.text_encoder.modules())[2].train()  # a mixed state must survive exactly
    modes = {m: m.training for module in modules for m in module.modules()}
    seen = []
    for module in modules:
        module.register_forward_pre_hook(lambda m, args: seen.append(m.training))
    original = generate._generate

    def greedy_generate(*args, **kwargs):  # code that draws from every global generator
        torch.rand(3), np.random.rand(3), random.random()
        seen.append(torch.is_grad_enabled())
        return original(*args, **kwargs)

    monkeypatch.setattr(generate, "_generate", greedy_generate)
    torch.manual_seed(5), np.random.seed(5), random.seed(5)
    expected = torch.rand(4), np.random.rand(4), random.random()
    torch.manual_seed(5), np.random.seed(5), random.seed(5)
    run(sdxl, [prompt(0, sampler="euler_a"), prompt(1, sampler="dpm_2_a")], tmp_path)
    after = torch.rand(4), np.random.rand(4), random.random()
    assert torch.equal(after[0], expected[0]) and (after[1] == expected[1]).all()
    assert after[2] == expected[2]
    assert len(seen) > 3 and not any(seen)  # every encoder and the UNet ran in eval, no grad
    assert {m: m.training for module in modules for m in module.modules()} == modes
    params = lora_parameters(sdxl.denoiser) + lora_parameters(sdxl.text_encoders[1])
    assert all(p.grad is None for p in params)
