"""Sampling during training: the image our sampler draws from the tiny Z-Image equals the one
diffusers' ZImagePipeline draws itself (its own prompt encoding, scheduler and VAE) for the same
prompt, seed and steps: Turbo's default without guidance, and a guided prompt with a negative
prompt."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

from library.config.flow_schema import FlowSection
from library.config.schema import ModelSection
from library.models.families.zimage.load import load_zimage
from library.sampling.generate import sample_images
from library.sampling.prompts import SamplePrompt


@pytest.fixture(scope="module")
def components(zimage_dir):
    return load_zimage(ModelSection(pretrained_model_name_or_path=str(zimage_dir)),
                       FlowSection(), torch.float32, torch.float32)  # fmt: skip


def _prompt(**keys) -> SamplePrompt:
    values = {"index": 0, "prompt": "a red cube on a table", "negative_prompt": "", "width": 64,
              "height": 64, "seed": 11, "steps": 3, "scale": None, "sampler": None}  # fmt: skip
    return SamplePrompt(**{**values, **keys})


def _ours(components, prompt, tmp_path) -> np.ndarray:
    done = sample_images(components, [prompt], step=0, output_dir=tmp_path, output_name="s")
    return np.asarray(Image.open(done.images[0]).convert("RGB"))


def _pipeline(pipe, prompt: SamplePrompt, guidance: float) -> np.ndarray:
    negative = prompt.negative_prompt if guidance > 0 else None
    image = pipe(prompt.prompt, negative_prompt=negative, guidance_scale=guidance,
                 num_inference_steps=prompt.steps, width=prompt.width, height=prompt.height,
                 generator=torch.Generator("cpu").manual_seed(prompt.seed),
                 output_type="pil").images[0]  # fmt: skip
    return np.asarray(image.convert("RGB"))


def test_turbo_samples_without_guidance_as_the_pipeline(components, zimage_pipe, tmp_path):
    prompt = _prompt()
    assert components.family.sampling_pipeline().complete(prompt).scale == 1.0
    ours = _ours(components, prompt, tmp_path)
    assert ours.shape == (64, 64, 3) and ours.std() > 0
    np.testing.assert_array_equal(ours, _pipeline(zimage_pipe, prompt, 0.0))


def test_a_guided_prompt_samples_as_the_pipeline(components, zimage_pipe, tmp_path):
    # the usual CFG scale 3 is the pipeline's pos + 2 * (pos - neg)
    prompt = _prompt(scale=3.0, negative_prompt="blurry, dark", seed=4, steps=2, width=80)
    ours = _ours(components, prompt, tmp_path)
    assert ours.shape == (64, 80, 3)
    np.testing.assert_array_equal(ours, _pipeline(zimage_pipe, prompt, 2.0))
    unguided = _pipeline(zimage_pipe, prompt, 0.0)
    assert not np.array_equal(ours, unguided)  # the guidance changed the image


def test_base_defaults_to_guidance(tmp_path):
    from library.models.families.zimage.family import zimage_family

    kind = zimage_family("base", 6.0).sampling_pipeline()
    assert kind.class_name == "ZImagePipeline" and kind.denoiser_argument == "transformer"
    assert kind.complete(_prompt()).scale == 4.0
