"""Qwen-Image-Edit-2509/2511 against diffusers' QwenImageEditPlusPipeline (with transformers' own
Qwen2.5-VL processor): a caption read with several references gives the pipeline's prompt
embeddings (each reference numbered, shown to Qwen2.5-VL at the pipeline's condition size), the
references' tokens enter the transformer as the pipeline feeds them (each with its own frame
grid), and a sample with a reference image is the pipeline's image."""

from __future__ import annotations

import math

import pytest
import torch
from PIL import Image

from library.models.conditioning import encode_conditioning
from library.models.families.base import REFERENCE_LATENTS_KEY, REFERENCE_PIXELS_KEY
from library.models.families.qwenimage_edit.conditioning import to_pil
from tests.models.qwenimage_edit.conftest import random_pixels, sample_pair

CAPTIONS = ["put the cat from picture 2 into picture 1", "swap the colours of both shapes"]


def _condition_images(pipe, images):
    """The pipeline's condition images, resized by its own image processor to its
    calculate_dimensions(384 * 384, ratio), written out here."""
    resized = []
    for image in images:
        ratio = image.width / image.height
        width = round(math.sqrt(384 * 384 * ratio) / 32) * 32
        height = round(math.sqrt(384 * 384 * ratio) / ratio / 32) * 32
        resized.append(pipe.image_processor.resize(image, height, width))
    return resized


@torch.no_grad()
def test_captions_read_with_several_references_are_the_pipelines(plus_components, plus_pipe):
    c = plus_components
    first, second = random_pixels(1, 64, 48), random_pixels(2, 48, 96)
    text = c.family.encode_text_with_references(
        c.tokenizers, c.text_encoders, CAPTIONS, [first, second], "cpu"
    )
    for i, caption in enumerate(CAPTIONS):
        images = _condition_images(plus_pipe, [to_pil(first[i]), to_pil(second[i])])
        states, _ = plus_pipe.encode_prompt(caption, image=images, device=torch.device("cpu"))
        n = int(text.lengths[i])
        assert n == states.shape[1]
        torch.testing.assert_close(text.hidden[i, :n], states[0], rtol=1e-5, atol=1e-6)
    # the order of the pictures matters ("Picture 1", "Picture 2")
    swapped = c.family.encode_text_with_references(
        c.tokenizers, c.text_encoders, CAPTIONS, [second, first], "cpu"
    )
    assert not torch.allclose(swapped.hidden, text.hidden)


@torch.no_grad()
def test_prediction_with_two_references_is_the_pipelines(plus_components, plus_pipe):
    c = plus_components
    gen = torch.Generator().manual_seed(3)
    noisy = torch.randn(1, 16, 1, 8, 6, generator=gen)
    references = [
        torch.randn(1, 16, 1, 6, 10, generator=gen),
        torch.randn(1, 16, 1, 4, 4, generator=gen),
    ]
    pixels = [random_pixels(4, 48, 80)[:1], random_pixels(5, 32, 32)[:1]]
    sigma = torch.tensor([0.4])
    batch = {REFERENCE_LATENTS_KEY: references, REFERENCE_PIXELS_KEY: pixels}
    cond = encode_conditioning(
        c.family, c.tokenizers, c.text_encoders, CAPTIONS[:1], "cpu", batch=batch
    )
    ours = c.family.predict(c.denoiser, noisy, sigma, cond)
    images = _condition_images(plus_pipe, [to_pil(p[0]) for p in pixels])
    states, mask = plus_pipe.encode_prompt(CAPTIONS[0], image=images, device=torch.device("cpu"))
    b, ch, _, h, w = noisy.shape
    tokens = [plus_pipe._pack_latents(noisy.transpose(1, 2), b, ch, h, w)]
    shapes = [(1, h // 2, w // 2)]
    for latents in references:
        rh, rw = latents.shape[-2:]
        tokens.append(plus_pipe._pack_latents(latents.transpose(1, 2), b, ch, rh, rw))
        shapes.append((1, rh // 2, rw // 2))
    out = plus_pipe.transformer(
        hidden_states=torch.cat(tokens, dim=1), timestep=sigma, encoder_hidden_states=states,
        encoder_hidden_states_mask=mask, img_shapes=[shapes], return_dict=False,
    )[0][:, : tokens[0].shape[1]]  # fmt: skip
    theirs = plus_pipe._unpack_latents(out, h * 8, w * 8, 8)
    torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-6)


def test_sample_prompts_take_one_or_more_references(plus_components, tmp_path):
    from library.errors import ConfigError
    from library.sampling.generate import check_sampling
    from library.sampling.prompts import SamplePrompt

    reference = tmp_path / "r.png"
    Image.new("RGB", (16, 16)).save(reference)
    prompt = SamplePrompt(index=0, prompt="x", negative_prompt="", width=64, height=64, seed=1,
                          steps=2, scale=None, sampler=None)  # fmt: skip
    from dataclasses import replace

    check_sampling(plus_components, [replace(prompt, references=(reference,) * 3)])
    with pytest.raises(ConfigError, match="gives 0 reference images .* at least 1 reference image"):
        check_sampling(plus_components, [prompt])


@pytest.mark.slow
def test_a_sample_with_a_reference_is_the_pipelines(plus_components, plus_pipe, tmp_path):
    """A reference already at the pipeline's VAE size (1024 x 1024) is read the same by both."""
    ours, theirs = sample_pair(plus_components, plus_pipe, tmp_path, 1, image_list=True)
    assert ours.shape == theirs.shape == (64, 80, 3)
    assert int(abs(ours - theirs).max()) <= 1
