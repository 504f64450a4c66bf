"""FLUX.1 Kontext [dev] against diffusers' FluxKontextPipeline: the reference image enters the
transformer as the pipeline feeds it (its tokens after the noisy image's, position ids (1, row,
column), the output for them dropped), the training loss with a reference equals one written
from the pipeline's own parts, and a sample with a reference image is the pipeline's image."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch
from PIL import Image

from library.models.conditioning import encode_conditioning
from library.models.families.base import REFERENCE_LATENTS_KEY
from tests.kits.flux.kit import reference_loss
from tests.models.step_inputs import step_inputs

CAPTIONS = ["make the red circle blue", "turn the square into a star"]


def _pipeline_prediction(pipe, noisy, reference, sigma, captions):
    """The transformer's prediction as FluxKontextPipeline's denoising loop makes it."""
    text, pooled, text_ids = pipe.encode_prompt(captions, None, max_sequence_length=512)
    b, c, h, w = noisy.shape
    tokens = pipe._pack_latents(noisy, b, c, h, w)
    ids = pipe._prepare_latent_image_ids(b, h // 2, w // 2, noisy.device, noisy.dtype)
    rh, rw = reference.shape[-2:]
    reference_tokens = pipe._pack_latents(reference, b, c, rh, rw)
    reference_ids = pipe._prepare_latent_image_ids(b, rh // 2, rw // 2, noisy.device, noisy.dtype)
    reference_ids[..., 0] = 1
    out = pipe.transformer(
        hidden_states=torch.cat([tokens, reference_tokens], dim=1),
        timestep=sigma,
        guidance=torch.full((b,), 3.5),
        pooled_projections=pooled,
        encoder_hidden_states=text,
        txt_ids=text_ids,
        img_ids=torch.cat([ids, reference_ids], dim=0),
        return_dict=False,
    )[0][:, : tokens.shape[1]]
    return pipe._unpack_latents(out, h * 8, w * 8, 8)


@torch.no_grad()
def test_prediction_with_a_reference_is_the_pipelines(kontext_components, kontext_pipe):
    c = kontext_components
    gen = torch.Generator().manual_seed(3)
    noisy = torch.randn(2, 16, 8, 6, generator=gen)
    reference = torch.randn(2, 16, 6, 10, generator=gen)  # its own size, as no_resize_control
    sigma = torch.tensor([0.3, 0.8])
    batch = {REFERENCE_LATENTS_KEY: [reference]}
    cond = encode_conditioning(
        c.family, c.tokenizers, c.text_encoders, CAPTIONS, "cpu", batch=batch
    )
    ours = c.family.predict(c.denoiser, noisy, sigma, cond)
    theirs = _pipeline_prediction(kontext_pipe, noisy, reference, sigma, CAPTIONS)
    torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-6)
    # the reference reaches the prediction: without it (or another one) it differs
    plain = encode_conditioning(c.family, c.tokenizers, c.text_encoders, CAPTIONS, "cpu")
    assert not torch.allclose(ours, c.family.predict(c.denoiser, noisy, sigma, plain), atol=1e-4)


def _reference_loss(pipe, batch, seed):
    """FLUX.1's plain reference loss (tests/kits/flux/kit.py), with the reference image encoded by the
    pipeline's own _encode_vae_image and appended as the pipeline appends it."""
    (reference_pixels,) = batch["reference_pixels"]
    reference = pipe._encode_vae_image(reference_pixels, generator=None)
    transformer = pipe.transformer
    forward = transformer.forward

    def with_reference(hidden_states, img_ids, **kwargs):
        """The pipeline's transformer with the reference tokens after the image's."""
        b, n = hidden_states.shape[:2]
        rh, rw = reference.shape[-2:]
        tokens = pipe._pack_latents(reference, b, 16, rh, rw)
        ids = pipe._prepare_latent_image_ids(b, rh // 2, rw // 2, "cpu", tokens.dtype)
        ids[..., 0] = 1
        out = forward(hidden_states=torch.cat([hidden_states, tokens], 1),
                      img_ids=torch.cat([img_ids, ids]), **kwargs)  # fmt: skip
        out.sample = out.sample[:, :n]
        return out

    transformer.forward = with_reference
    try:
        return reference_loss(pipe, batch, seed)
    finally:
        del transformer.forward


def test_training_loss_with_a_reference_is_the_pipelines(kontext_components, kontext_pipe):
    from library.training.step import micro_batch_loss

    gen = torch.Generator().manual_seed(5)
    batch = {
        "captions": CAPTIONS,
        "loss_weights": torch.tensor([1.0, 0.5]),
        "positions": torch.tensor([3, 8]),
        "epoch": 2,
        "pixel_values": torch.rand(2, 3, 64, 48, generator=gen) * 2 - 1,
        "reference_pixels": [torch.rand(2, 3, 48, 80, generator=gen) * 2 - 1],
    }
    inputs = step_inputs(kontext_components, 11)
    with torch.no_grad():
        ours = micro_batch_loss(inputs, batch)
        expected = _reference_loss(kontext_pipe, batch, 11)
        torch.testing.assert_close(ours, expected, rtol=1e-5, atol=1e-7)
        other = {**batch, "reference_pixels": [-batch["reference_pixels"][0]]}
        assert not torch.allclose(ours, micro_batch_loss(inputs, other))


def test_a_sample_with_a_reference_is_the_pipelines(kontext_dir, kontext_pipe, tmp_path):
    from library.sampling.generate import reference_entries, sample_images
    from library.sampling.prompts import SamplePrompt

    pixels = np.random.default_rng(0).integers(0, 256, (48, 80, 3), dtype=np.uint8)
    reference = tmp_path / "reference.png"
    Image.fromarray(pixels).save(reference)
    prompt = SamplePrompt(index=0, prompt="make it blue", negative_prompt="", width=80,
                          height=64, seed=7, steps=3, scale=None, sampler=None,
                          references=(reference,))  # fmt: skip
    from library.config.flow_schema import FlowSection
    from library.config.schema import ModelSection
    from library.models.loader import load_components

    model = ModelSection(pretrained_model_name_or_path=str(kontext_dir))
    components = load_components(model, torch.float32, FlowSection())
    done = sample_images(components, [prompt], step=0, output_dir=tmp_path / "out",
                         output_name="s")  # fmt: skip
    with Image.open(done.images[0]) as img:
        ours = np.asarray(img.convert("RGB"), dtype=np.int16)
    shown = Image.open(reference).convert("RGB")
    theirs = _their_sample(kontext_pipe, prompt, _fitted(shown, 80, 64))
    assert ours.shape == theirs.shape == (64, 80, 3)
    assert int(abs(ours - theirs).max()) <= 1
    # The tiny model's image hardly depends on its reference (a mirrored one changes no pixel
    # by more than a level), so the reference's way in is pinned on its latents: the ones our
    # sampling gives the pipeline are those the pipeline makes of the fitted image itself.
    ours = reference_entries(components, prompt, "cpu", 1)[REFERENCE_LATENTS_KEY][0]
    fitted = kontext_pipe.image_processor.preprocess(_fitted(shown, 80, 64), 64, 80)
    with torch.no_grad():
        torch.testing.assert_close(ours, kontext_pipe._encode_vae_image(fitted, None))
        mirrored = kontext_pipe._encode_vae_image(fitted.flip(-1), None)
    assert not torch.allclose(ours, mirrored, atol=1e-3)
    # the grid shows the reference, then the result
    with Image.open(done.grid) as grid:
        assert grid.size[0] >= 80 + 80 * 64 // 48


def _fitted(image, width, height):
    """``image`` scaled to cover width x height and center-cropped (how a reference is fitted
    to the sample's size), written with PIL alone."""
    scale = max(width / image.width, height / image.height)
    size = (round(image.width * scale), round(image.height * scale))
    scaled = image.resize(size, Image.Resampling.LANCZOS)
    left, top = (size[0] - width) // 2, (size[1] - height) // 2
    return scaled.crop((left, top, left + width, top + height))


@torch.no_grad()
def _their_sample(pipe, prompt, reference):
    """FluxKontextPipeline's image for ``prompt`` at its own size with ``reference`` as given."""
    image = pipe(
        image=reference, prompt=prompt.prompt, width=prompt.width, height=prompt.height,
        max_area=prompt.width * prompt.height, _auto_resize=False,
        num_inference_steps=prompt.steps, guidance_scale=3.5,
        generator=torch.Generator().manual_seed(prompt.seed),
    ).images[0]  # fmt: skip
    return np.asarray(image.convert("RGB"), dtype=np.int16)


def test_sample_prompts_give_the_one_reference_kontext_takes(kontext_components, tmp_path):
    from library.errors import ConfigError
    from library.sampling.generate import check_sampling
    from library.sampling.prompts import SamplePrompt

    reference = tmp_path / "r.png"
    Image.new("RGB", (16, 16)).save(reference)
    prompt = SamplePrompt(index=1, prompt="x", negative_prompt="", width=64, height=64, seed=1,
                          steps=2, scale=None, sampler=None)  # fmt: skip
    check_sampling(kontext_components, [replace(prompt, references=(reference,))])
    with pytest.raises(ConfigError, match="prompt 2 gives 0 reference images .* take 1 reference"):
        check_sampling(kontext_components, [prompt])
    with pytest.raises(ConfigError, match="gives 2 reference images"):
        check_sampling(kontext_components, [replace(prompt, references=(reference,) * 2)])


def test_flux_lora_files_are_kontext_files_and_back(kontext_components):
    from library.lora_tools.base_model import other_family
    from library.models.families.flux.family import FLUX_DEV

    names = ["lora_unet_double_blocks_0_img_attn_qkv.lora_down.weight"]
    kontext = kontext_components.family
    for metadata in (None, {"ss_base_model_version": "flux1"}):
        assert other_family(names, metadata, kontext) is None  # a FLUX.1 LoRA continues here
    assert other_family(names, {"ss_base_model_version": "flux1_kontext"}, FLUX_DEV) is None
    sd3 = ["lora_unet_joint_blocks_0_x_block_attn_qkv.lora_down.weight"]
    assert other_family(sd3, None, kontext) == "SD3/SD3.5"
