"""Sampling SD3/SD3.5 during training against diffusers' StableDiffusion3Pipeline on the same
modules: its own prompt encoding, schedule and guidance are the reference for ours. (Each
variant's guided image is the conformance suite's test_sample_equals_the_diffusers_pipeline;
here: kohya's default scale, live LoRA, the pipeline inputs.)"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from sampling_helpers import first_image, prompt, same

from library.models.conditioning import Conditioning
from library.models.families.sd3.sampling import sd3_pipeline_inputs
from library.networks.lora import LoraSpec, apply_lora, randomize_lora
from library.sampling.prompts import SamplePrompt
from tests.kits.sd3.kit import RELEASED_SCHEDULER
from tests.training.sd3_fixtures import plain_sd3_pipeline, tiny_sd3_components


def sd3_prompt(index: int = 0, text: str = "a red circle", **kw) -> SamplePrompt:
    """An 80 x 64, 3-step Euler prompt with classifier-free guidance 4."""
    values = dict(width=80, height=64, steps=3, scale=4.0, sampler="euler", seed=7)
    return prompt(index, text, **(values | kw))


def ours(components, p, tmp_path, step=0) -> np.ndarray:
    return first_image(components, p, tmp_path, step, "sd3")


@torch.no_grad()
def reference(components, p, **call) -> np.ndarray:
    """StableDiffusion3Pipeline on the same modules, encoding the prompt itself."""
    from diffusers import FlowMatchEulerDiscreteScheduler

    pipe = plain_sd3_pipeline(components)
    pipe.scheduler = FlowMatchEulerDiscreteScheduler(**RELEASED_SCHEDULER)
    pipe.set_progress_bar_config(disable=True)
    image = pipe(
        prompt=p.prompt,
        negative_prompt=p.negative_prompt or "",
        width=p.width,
        height=p.height,
        num_inference_steps=p.steps,
        guidance_scale=p.scale,
        generator=torch.Generator().manual_seed(p.seed),
        **call,
    ).images[0]
    return np.asarray(image, dtype=np.int16)


def test_unset_scale_is_kohyas_sd3_default_and_live_lora_changes_the_image(tmp_path):
    c = tiny_sd3_components()
    p = sd3_prompt(scale=None)
    image = ours(c, p, tmp_path)
    assert same(image, reference(c, sd3_prompt(scale=7.5)))
    targets = c.family.adapter_targets(c.denoiser, "unet", conv=False)
    apply_lora(c.denoiser, targets, LoraSpec(dim=4, alpha=4))
    randomize_lora(c.denoiser, torch.Generator().manual_seed(0), std=0.5)
    assert np.abs(ours(c, p, tmp_path, 1) - image).mean() > 1


def test_pipeline_inputs_carry_both_embeddings_and_round_the_size():
    hidden, pooled = torch.randn(2, 5, 8), torch.randn(2, 4)
    cond = Conditioning(hidden, {"pooled_projections": pooled})
    p = SamplePrompt(index=0, prompt="x", negative_prompt="n", width=72, height=100, seed=1,
                     steps=2, sampler="euler", scale=5.0)  # fmt: skip
    inputs = sd3_pipeline_inputs(cond, p)
    assert torch.equal(inputs["prompt_embeds"], hidden[:1])
    assert torch.equal(inputs["negative_prompt_embeds"], hidden[1:])
    assert torch.equal(inputs["pooled_prompt_embeds"], pooled[:1])
    assert torch.equal(inputs["negative_pooled_prompt_embeds"], pooled[1:])
    assert (inputs["width"], inputs["height"], inputs["guidance_scale"]) == (64, 96, 5.0)
    with pytest.raises(ValueError, match="text_mask"):
        sd3_pipeline_inputs(Conditioning(hidden, {"pooled_projections": pooled,
                                                  "text_mask": hidden}), p)  # fmt: skip
