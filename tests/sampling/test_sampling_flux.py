"""Sampling Flux.1 during training against diffusers' FluxPipeline run directly on the same
modules: its own prompt encoding, packing, schedule and guidance are the reference for ours.
(The default guidance, true CFG and schnell's schedule are the conformance suite's
test_sample_equals_the_diffusers_pipeline; here: the T5 mask, live LoRA, sampler names, the
prompt options' mapping.)"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from sampling_helpers import first_image, pixels, prompt, same

from library.errors import ConfigError
from library.models.conditioning import Conditioning
from library.models.families.flux.sampling import (
    flux_pipeline_inputs,
    flux_scheduler_config,
)
from library.networks.lora import LoraSpec, apply_lora, lora_parameters, randomize_lora
from library.sampling.generate import check_sampling, sample_images
from library.sampling.prompts import SamplePrompt
from library.sampling.samplers import build_flow_sampler
from tests.kits.flux.kit import RELEASED_SCHEDULERS, T5_LENGTH
from tests.training.flux_fixtures import plain_flux_pipeline, tiny_flux_components


def flux(variant: str = "dev", **flow_keys):
    """Tiny Flux.1 Components (their objective samples with the variant's released scheduler)."""
    return tiny_flux_components(variant, **flow_keys)


def flux_prompt(index: int = 0, text: str = "a red circle", **kw) -> SamplePrompt:
    """An 80 x 64, 3-step Euler prompt without true CFG (kohya's Flux default, --l 1)."""
    values = dict(width=80, height=64, steps=3, scale=1.0, sampler="euler", seed=7)
    return prompt(index, text, **(values | kw))


def ours(components, p, tmp_path, step=0) -> np.ndarray:
    return first_image(components, p, tmp_path, step, "flux")


@torch.no_grad()
def reference(components, variant, p, **call) -> np.ndarray:
    """diffusers' FluxPipeline on the same modules, encoding the prompt itself."""
    from diffusers import FlowMatchEulerDiscreteScheduler

    pipe = plain_flux_pipeline(components)
    pipe.scheduler = FlowMatchEulerDiscreteScheduler(**RELEASED_SCHEDULERS[variant])
    pipe.set_progress_bar_config(disable=True)
    image = pipe(
        prompt=p.prompt,
        width=p.width,
        height=p.height,
        num_inference_steps=p.steps,
        generator=torch.Generator().manual_seed(p.seed),
        **{"max_sequence_length": T5_LENGTH[variant], **call},
    ).images[0]
    return np.asarray(image, dtype=np.int16)


def test_masked_t5_padding_samples_as_if_there_were_no_padding(tmp_path):
    """apply_t5_attn_mask: the image equals FluxPipeline's with the prompt encoded at exactly
    its own length (no padding to mask)."""
    c = flux("dev", apply_t5_attn_mask=True)
    p = flux_prompt()
    image = ours(c, p, tmp_path)
    length = len(c.tokenizers[1](p.prompt).input_ids)
    expected = reference(c, "dev", p, guidance_scale=3.5, max_sequence_length=length)
    assert same(image, expected)
    assert not same(image, reference(c, "dev", p, guidance_scale=3.5))  # padding matters
    with pytest.raises(ConfigError, match="apply_t5_attn_mask"):
        ours(c, flux_prompt(negative_prompt="blurry", scale=4.0), tmp_path, 1)


def test_live_lora_on_the_transformer_changes_the_image(tmp_path):
    c = flux("dev")
    p = flux_prompt()
    plain = ours(c, p, tmp_path, 0)
    targets = c.family.adapter_targets(c.denoiser, "unet", conv=False)
    apply_lora(c.denoiser, targets, LoraSpec(dim=4, alpha=4))
    assert (ours(c, p, tmp_path, 1) == plain).all()  # a fresh adapter (up = 0) changes nothing
    randomize_lora(c.denoiser, torch.Generator().manual_seed(0), std=0.5)
    assert np.abs(ours(c, p, tmp_path, 2) - plain).mean() > 1  # clearly, not by rounding
    with torch.no_grad():
        for param in lora_parameters(c.denoiser):
            param.zero_()
    assert (ours(c, p, tmp_path, 3) == plain).all()


@pytest.mark.parametrize("name", ["ddim", "euler_a", "k_lms"])
def test_sd_sampler_names_sample_with_euler_and_say_so(name, tmp_path, caplog):
    """GUIs write their SD default sampler into Flux/SD3 configs and sd-scripts samples those
    with Euler whatever it says: so do we, with one warning naming the setting."""
    from library.sampling import samplers

    samplers._warned_flow_samplers.discard(name)
    c = flux("dev")
    p = flux_prompt(text="a blue square", seed=3)
    with caplog.at_level("WARNING"):
        check_sampling(c, [flux_prompt(0), flux_prompt(1, sampler=name)])
        image = ours(c, dataclasses.replace(p, sampler=name), tmp_path)
    assert caplog.text.count(f'sample_sampler "{name}"') == 1
    assert same(image, ours(c, p, tmp_path, 1))


def test_both_euler_names_give_the_released_flow_scheduler():
    for variant, released in RELEASED_SCHEDULERS.items():
        for name in ("euler", "k_euler"):
            scheduler = build_flow_sampler(name, flux_scheduler_config(variant))
            assert type(scheduler).__name__ == "FlowMatchEulerDiscreteScheduler"
            assert {k: scheduler.config[k] for k in released} == released


def test_pipeline_inputs_map_kohyas_prompt_options():
    hidden, pooled = torch.randn(2, 5, 8), torch.randn(2, 4)
    cond = Conditioning(hidden, {"pooled_projections": pooled})
    base = dict(index=0, prompt="x", negative_prompt="n", width=72, height=100, seed=1, steps=2,
                sampler="euler")  # fmt: skip
    plain = flux_pipeline_inputs(cond, SamplePrompt(**base, scale=1.0))
    assert plain.keys() == {"prompt_embeds", "pooled_prompt_embeds", "guidance_scale", "width",
                            "height"}  # fmt: skip
    assert torch.equal(plain["prompt_embeds"], hidden[:1])
    assert torch.equal(plain["pooled_prompt_embeds"], pooled[:1])
    # kohya's 16-pixel rounding (down) and default distilled guidance
    assert (plain["width"], plain["height"], plain["guidance_scale"]) == (64, 96, 3.5)
    # --g sets the distilled guidance; --l above 1 turns true CFG on with the negative prompt
    guided = flux_pipeline_inputs(cond, SamplePrompt(**base, scale=5.0, guidance_scale=2.0))
    assert guided["guidance_scale"] == 2.0 and guided["true_cfg_scale"] == 5.0
    assert torch.equal(guided["negative_prompt_embeds"], hidden[1:])
    assert torch.equal(guided["negative_pooled_prompt_embeds"], pooled[1:])
    # a conditioning input the pipeline cannot take is an error, not silently dropped
    odd = Conditioning(hidden, {"pooled_projections": pooled, "mask": torch.ones(2, 5)})
    with pytest.raises(ValueError, match="'mask'"):
        flux_pipeline_inputs(odd, SamplePrompt(**base, scale=1.0))


def test_unset_scale_and_sampler_take_the_models_defaults(tmp_path):
    """A prompt leaving scale, sampler and guidance to the model (None) samples with Euler,
    without true CFG, at distilled guidance 3.5, and its PNG text names what was used."""
    from PIL import Image

    c = flux("dev")
    given = ours(c, flux_prompt(negative_prompt="blurry"), tmp_path, 0)
    unset = flux_prompt(negative_prompt="blurry", scale=None, sampler=None)
    (path,) = sample_images(
        c, [unset], step=1, output_dir=tmp_path / "out", output_name="flux"
    ).images
    assert (pixels(path) == given).all()
    with Image.open(path) as img:
        text = img.text["parameters"]
    assert text == (
        "a red circle\nNegative prompt: blurry\nSteps: 3, Sampler: euler, CFG scale: 1, "
        "Distilled CFG Scale: 3.5, Seed: 7, Size: 80x64"
    )
