"""sample_images: files and sizes, the grid, live models, seeds, and no trace left on training."""

from __future__ import annotations

import random

import numpy as np
import torch
from sampling_helpers import load, pixels, prompt

import library.sampling.generate as generate
from library.networks.lora import LoraSpec, apply_lora, lora_parameters, randomize_lora
from library.sampling.generate import sample_images


def run(components, prompts, tmp_path, step=7, **kw):
    return sample_images(
        components, prompts, step=step, output_dir=tmp_path / "out", output_name="run", **kw
    )


def test_names_sizes_and_grid(components, tmp_path):
    prompts = [prompt(0), prompt(1, width=96, seed=5), prompt(2, height=80, seed=9)]
    result = run(components, prompts, tmp_path, step=7)
    folder = tmp_path / "out" / "sample"
    names = ["run_000007_00_100.png", "run_000007_01_5.png", "run_000007_02_9.png"]
    assert result.images == [folder / n for n in names]
    assert sorted(p.name for p in folder.iterdir()) == sorted(names + ["run_000007_grid.png"])
    shapes = [pixels(folder / n).shape for n in names]
    assert shapes == [(64, 64, 3), (64, 96, 3), (80, 64, 3)]
    # 3 images -> 2 columns x 2 rows of cells as large as the largest image (96 x 80).
    assert result.grid == folder / "run_000007_grid.png"
    grid = pixels(result.grid)
    assert grid.shape == (160, 192, 3)
    assert (grid[:64, :64] == pixels(folder / names[0])).all()
    assert (grid[:64, 96:192] == pixels(folder / names[1])).all()
    assert (grid[80:160, :64] == pixels(folder / names[2])).all()
    assert (grid[64:80, :96] == 0).all() and (grid[80:, 64:] == 0).all()  # empty cell space


def reference_embeds(pipe, text: str, clip_skip: int | None) -> torch.Tensor:
    """CLIP conditioning by hand: kohya's clip_skip N takes the N-th hidden state from the end
    through the final layer norm."""
    ids = pipe.tokenizer(text, padding="max_length", max_length=77, return_tensors="pt").input_ids
    out = pipe.text_encoder(ids, output_hidden_states=True)
    if clip_skip is None:
        return out.last_hidden_state
    inner = getattr(pipe.text_encoder, "text_model", pipe.text_encoder)
    return inner.final_layer_norm(out.hidden_states[-clip_skip])


@torch.no_grad()
def test_clip_skip_samples_as_a_plain_diffusers_pipeline(tiny_sd2v_model_dir, tmp_path):
    """With clip_skip, the assembled pipeline and our text path reproduce diffusers' own
    pipeline for a v-prediction model (the folder's DDIM scheduler says v_prediction) given the
    text states by hand; clip_skip does reach the image. (Without it, diffusers encoding the
    text itself: the conformance suite's test_sample_equals_the_diffusers_pipeline.)"""
    from diffusers import DDIMScheduler, StableDiffusionPipeline

    model_dir = tiny_sd2v_model_dir
    reference = StableDiffusionPipeline.from_pretrained(model_dir, safety_checker=None)
    reference.scheduler = DDIMScheduler.from_pretrained(model_dir, subfolder="scheduler")
    reference.set_progress_bar_config(disable=True)
    p = prompt(0, "a blue circle", negative_prompt="green", seed=3)
    ours = {}
    for step, clip_skip in enumerate((None, 2)):
        (path,) = run(load(model_dir), [p], tmp_path, step=step, clip_skip=clip_skip).images
        ours[clip_skip] = pixels(path)
    # diffusers' own clip_skip fails on transformers 5's CLIPTextModel
    image = reference(
        prompt_embeds=reference_embeds(reference, "a blue circle", 2),
        negative_prompt_embeds=reference_embeds(reference, "green", 2),
        width=64,
        height=64,
        num_inference_steps=2,
        guidance_scale=7.5,
        generator=torch.Generator().manual_seed(3),
    ).images[0]
    assert np.abs(ours[2] - np.asarray(image, dtype=np.int16)).max() <= 1
    assert np.abs(ours[None] - ours[2]).mean() > 1  # clip_skip does reach the images


def test_same_seed_same_image_other_seed_other_image(components, tmp_path):
    first = run(components, [prompt(0, seed=1), prompt(1, seed=2)], tmp_path, step=1).images
    again = run(components, [prompt(0, seed=1)], tmp_path, step=2).images
    assert (pixels(first[0]) == pixels(again[0])).all()
    assert (pixels(first[0]) != pixels(first[1])).any()


def test_live_adapter_weights_are_used(components, tmp_path):
    p = prompt(0, sampler="euler_a")
    plain = pixels(run(components, [p], tmp_path, step=1).images[0])
    apply_lora(components.denoiser, "unet", LoraSpec(dim=4, alpha=4))
    fresh = pixels(run(components, [p], tmp_path, step=2).images[0])
    assert (fresh == plain).all()  # a fresh adapter (up = 0) changes nothing
    randomize_lora(components.denoiser, torch.Generator().manual_seed(0), std=0.5)
    adapted = pixels(run(components, [p], tmp_path, step=3).images[0])
    assert np.abs(adapted - plain).mean() > 1
    with torch.no_grad():  # edit the weights in place: the next round must show it
        for param in lora_parameters(components.denoiser):
            param.zero_()
    assert (pixels(run(components, [p], tmp_path, step=4).images[0]) == plain).all()


def test_rng_states_modes_and_gradients_are_restored(components, tmp_path, monkeypatch):
    apply_lora(components.denoiser, "unet", LoraSpec(dim=4, alpha=4))
    unet, text_encoder = components.denoiser, components.text_encoder
    unet.train()
    text_encoder.eval()
    list(text_encoder.modules())[3].train()  # a mixed state must survive exactly
    modes = {m: m.training for m in [*unet.modules(), *text_encoder.modules()]}
    seen_training = []
    unet.register_forward_pre_hook(lambda module, args: seen_training.append(module.training))

    original = generate._generate

    def greedy_generate(*args, **kwargs):  # code that draws from every global generator
        torch.rand(3), np.random.rand(3), random.random()
        seen_training.append(torch.is_grad_enabled())
        return original(*args, **kwargs)

    monkeypatch.setattr(generate, "_generate", greedy_generate)
    torch.manual_seed(11), np.random.seed(11), random.seed(11)
    states = torch.get_rng_state(), np.random.get_state(), random.getstate()
    run(components, [prompt(0, sampler="euler_a"), prompt(1, sampler="dpm_2_a")], tmp_path)
    assert torch.equal(torch.get_rng_state(), states[0])
    after = np.random.get_state()
    assert (
        after[0] == states[1][0] and (after[1] == states[1][1]).all() and after[2:] == states[1][2:]
    )
    assert random.getstate() == states[2]
    assert seen_training and not any(seen_training)  # eval mode and no grad inside
    assert {m: m.training for m in [*unet.modules(), *text_encoder.modules()]} == modes
    assert all(p.grad is None for p in lora_parameters(unet))


def test_a_round_samples_inside_the_familys_sampling_weights(components, tmp_path, monkeypatch):
    """The family's sampling_weights context is entered before the first image and left after
    the last (a family swaps another checkpoint's weights in for the round there)."""
    import contextlib

    events = []
    real = generate._generate

    @contextlib.contextmanager
    def weights(self, denoiser):
        events.append(("enter", denoiser is components.denoiser))
        yield
        events.append(("exit", None))

    def recording(*args, **kwargs):
        events.append(("image", None))
        return real(*args, **kwargs)

    monkeypatch.setattr(type(components.family), "sampling_weights", weights)
    monkeypatch.setattr(generate, "_generate", recording)
    run(components, [prompt(0), prompt(1)], tmp_path)
    assert events == [("enter", True), ("image", None), ("image", None), ("exit", None)]
