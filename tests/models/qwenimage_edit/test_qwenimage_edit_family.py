"""Qwen-Image-Edit against diffusers' QwenImageEditPipeline (with transformers' own Qwen2.5-VL
processor): a caption read with its reference image gives the pipeline's prompt embeddings, the
reference's tokens enter the transformer as the pipeline feeds them (after the image's, with
their own frame grid), the training loss with a reference equals one written from the
pipeline's parts, and a sample with a reference image is the pipeline's image."""

from __future__ import annotations

import pytest
import torch

from library.errors import ModelError
from library.models.conditioning import encode_conditioning
from library.models.families.base import REFERENCE_LATENTS_KEY, REFERENCE_PIXELS_KEY
from library.models.families.qwenimage_edit.conditioning import to_pil
from tests.kits.qwenimage_edit.kit import transformers_processor
from tests.models.qwenimage_edit.conftest import random_pixels, sample_pair
from tests.models.step_inputs import step_inputs

CAPTIONS = ["make the red circle blue", "turn the square into a star on a plain background"]


def test_the_processor_is_transformers_qwen2vl_processor(edit_components, edit_dir):
    ours = edit_components.tokenizers[1]
    theirs = transformers_processor(edit_dir / "processor")
    images = [to_pil(p) for p in random_pixels(1, 64, 48)]
    texts = [
        "<|vision_start|><|image_pad|><|vision_end|>x",
        "<|vision_start|><|image_pad|><|vision_end|>yy",
    ]
    a, b = (
        ours(text=texts, images=images),
        theirs(text=texts, images=images, padding=True, return_tensors="pt"),
    )
    for key in ("input_ids", "attention_mask", "pixel_values", "image_grid_thw"):
        assert torch.equal(a[key], b[key]), key


def test_a_processor_folder_saved_by_transformers_5_is_read(edit_dir, edit_components, tmp_path):
    """processor/ with processor_config.json (transformers 5's layout, the image processor's
    settings inside) instead of preprocessor_config.json: the same processor."""
    import shutil

    from library.config.flow_schema import FlowSection
    from library.config.schema import ModelSection
    from library.models.loader import load_components
    from library.models.model_files import shapes_only
    from tests.models.qwenimage.test_qwenimage_files import as_transformers_5_processor

    folder = tmp_path / "edit"
    shutil.copytree(edit_dir, folder)
    as_transformers_5_processor(folder / "processor")
    with shapes_only():
        parts = load_components(
            ModelSection(pretrained_model_name_or_path=str(folder)), torch.float32, FlowSection()
        )
    ours = parts.tokenizers[1].image_processor.to_dict()
    assert ours == edit_components.tokenizers[1].image_processor.to_dict()
    (folder / "processor" / "processor_config.json").unlink()
    with pytest.raises(
        ModelError, match=r"processor has neither preprocessor_config.json nor processor"
    ):
        load_components(
            ModelSection(pretrained_model_name_or_path=str(folder)), torch.float32, FlowSection()
        )


@torch.no_grad()
def test_captions_read_with_their_reference_are_the_pipelines(edit_components, edit_pipe):
    c = edit_components
    pixels = random_pixels(2, 64, 48)
    text = c.family.encode_text_with_references(
        c.tokenizers, c.text_encoders, CAPTIONS, [pixels], "cpu"
    )
    for i, caption in enumerate(CAPTIONS):
        states, mask = edit_pipe.encode_prompt(
            caption, image=to_pil(pixels[i]), device=torch.device("cpu")
        )
        n = int(text.lengths[i])
        assert n == states.shape[1]
        torch.testing.assert_close(text.hidden[i, :n], states[0], rtol=1e-5, atol=1e-6)
        assert not text.hidden[i, n:].any()
    # the reference reaches the states
    other = c.family.encode_text_with_references(
        c.tokenizers, c.text_encoders, CAPTIONS, [-pixels], "cpu"
    )
    assert not torch.allclose(other.hidden, text.hidden)


def _pipeline_prediction(pipe, noisy, reference, sigma, states, mask):
    b, c, _, h, w = noisy.shape
    rh, rw = reference.shape[-2:]
    tokens = pipe._pack_latents(noisy.transpose(1, 2), b, c, h, w)
    reference_tokens = pipe._pack_latents(reference.transpose(1, 2), b, c, rh, rw)
    out = pipe.transformer(
        hidden_states=torch.cat([tokens, reference_tokens], dim=1),
        timestep=sigma,
        encoder_hidden_states=states,
        encoder_hidden_states_mask=mask,
        img_shapes=[[(1, h // 2, w // 2), (1, rh // 2, rw // 2)]] * b,
        return_dict=False,
    )[0][:, : tokens.shape[1]]
    return pipe._unpack_latents(out, h * 8, w * 8, 8)


@torch.no_grad()
def test_prediction_with_a_reference_is_the_pipelines(edit_components, edit_pipe):
    c = edit_components
    gen = torch.Generator().manual_seed(3)
    noisy = torch.randn(1, 16, 1, 8, 6, generator=gen)
    reference = torch.randn(1, 16, 1, 6, 10, generator=gen)
    pixels = random_pixels(4, 48, 80)[:1]
    sigma = torch.tensor([0.4])
    batch = {REFERENCE_LATENTS_KEY: [reference], REFERENCE_PIXELS_KEY: [pixels]}
    cond = encode_conditioning(
        c.family, c.tokenizers, c.text_encoders, CAPTIONS[:1], "cpu", batch=batch
    )
    ours = c.family.predict(c.denoiser, noisy, sigma, cond)
    states, mask = edit_pipe.encode_prompt(
        CAPTIONS[0], image=to_pil(pixels[0]), device=torch.device("cpu")
    )
    theirs = _pipeline_prediction(edit_pipe, noisy, reference, sigma, states, mask)
    torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-6)
    without = {REFERENCE_PIXELS_KEY: [pixels]}
    plain = encode_conditioning(
        c.family, c.tokenizers, c.text_encoders, CAPTIONS[:1], "cpu", batch=without
    )
    assert not torch.allclose(ours, c.family.predict(c.denoiser, noisy, sigma, plain), atol=1e-4)


def _reference_loss(pipe, batch, seed, shift=2.2):
    """Qwen-Image's loss written from the pipeline's parts (tests/kits/qwenimage/kit.py's, with the
    trainer's keyed draws and musubi-tuner's shift 2.2), each caption encoded by the pipeline
    with its reference image, the reference encoded by the pipeline's _encode_vae_image and
    packed after the image's tokens as the pipeline's denoising loop does."""
    from library.training.noise import NoiseOptions, draw

    posterior = pipe.vae.encode(batch["pixel_values"].unsqueeze(2)).latent_dist
    shape = tuple(posterior.mean.shape[1:])
    d = draw(seed, batch["epoch"], batch["positions"].tolist(), shape, 1000,
             torch.device("cpu"), NoiseOptions(), flow_times=True)  # fmt: skip
    config = pipe.vae.config
    mean = torch.tensor(config.latents_mean).view(1, -1, 1, 1, 1)
    std = torch.tensor(config.latents_std).view(1, -1, 1, 1, 1)
    x0 = (posterior.mean + posterior.std * d.latent_eps - mean) / std
    u = torch.sigmoid(d.time_normal)
    sigma = shift * u / (1 + (shift - 1) * u)
    s = sigma.view(-1, 1, 1, 1, 1)
    noisy = (1 - s) * x0 + s * d.noise
    (reference_pixels,) = batch["reference_pixels"]
    reference = pipe._encode_vae_image(reference_pixels.unsqueeze(2), generator=None)
    losses = []
    for i, caption in enumerate(batch["captions"]):
        states, mask = pipe.encode_prompt(caption, image=to_pil(reference_pixels[i]),
                                          device=torch.device("cpu"))  # fmt: skip
        out = _pipeline_prediction(pipe, noisy[i : i + 1], reference[i : i + 1], sigma[i : i + 1],
                                   states, mask)  # fmt: skip
        losses.append(((out - (d.noise[i : i + 1] - x0[i : i + 1])) ** 2).mean())
    return (torch.stack(losses) * batch["loss_weights"]).mean()


def test_training_loss_with_a_reference_is_the_pipelines(edit_components, edit_pipe):
    from library.training.step import micro_batch_loss

    batch = {
        "captions": CAPTIONS,
        "loss_weights": torch.tensor([1.0, 0.5]),
        "positions": torch.tensor([3, 8]),
        "epoch": 2,
        "pixel_values": random_pixels(5, 64, 48),
        "reference_pixels": [random_pixels(6, 48, 80)],
    }
    inputs = step_inputs(edit_components, 11)
    with torch.no_grad():
        ours = micro_batch_loss(inputs, batch)
        torch.testing.assert_close(
            ours, _reference_loss(edit_pipe, batch, 11), rtol=1e-5, atol=1e-7
        )
        other = {**batch, "reference_pixels": [-batch["reference_pixels"][0]]}
        assert not torch.equal(ours, micro_batch_loss(inputs, other))  # the reference counts


@pytest.mark.slow
def test_a_sample_with_a_reference_is_the_pipelines(edit_components, edit_pipe, tmp_path):
    """The pipeline resizes every reference to about a megapixel; a reference already at that
    size (1024 x 1024) is read the same by both, so the images must agree."""
    ours, theirs = sample_pair(edit_components, edit_pipe, tmp_path, 0, image_list=False)
    assert ours.shape == theirs.shape == (64, 80, 3)
    assert int(abs(ours - theirs).max()) <= 1


def test_qwenimage_lora_files_are_edit_files_and_back(edit_components):
    from library.lora_tools.base_model import other_family
    from library.models.families.qwenimage.family import qwenimage_family

    names = ["diffusion_model.transformer_blocks.0.img_mlp.net.0.proj.lora_down.weight"]
    edit = edit_components.family
    for metadata in (None, {"ss_base_model_version": "qwen_image"}):
        assert other_family(names, metadata, edit) is None
    assert (
        other_family(names, {"ss_base_model_version": "qwen_image_edit"}, qwenimage_family())
        is None
    )


def test_the_reference_size_of_a_sample_is_the_pipelines(edit_components):
    # calculate_dimensions(1024 * 1024, ratio), written out: sqrt(area * ratio), sides to 32
    family = edit_components.family
    assert family.sample_reference_size((1024, 1024), 64, 64) == (1024, 1024)
    assert family.sample_reference_size((1920, 1080), 64, 64) == (1376, 768)  # 1365.3 x 768
    assert family.sample_reference_size((600, 800), 64, 64) == (896, 1184)  # 886.8 x 1182.4


def test_the_text_cache_identity_covers_the_image_processor(edit_components):
    """Qwen2.5-VL reads what the image processor makes of a reference: another setting, another
    cache identity (a plain tokenizer's identity is unchanged by the processor's settings)."""
    import copy

    from library.training.text_cache import text_identity

    c = edit_components
    base = text_identity(c.family, c.text_encoders, None, None, None, tokenizers=c.tokenizers)
    changed = copy.copy(c.tokenizers[1])
    changed.image_processor = copy.deepcopy(c.tokenizers[1].image_processor)
    changed.image_processor.max_pixels = 512 * 512
    other = text_identity(c.family, c.text_encoders, None, None, None,
                          tokenizers=(c.tokenizers[0], changed))  # fmt: skip
    assert other != base


def test_a_lora_learns_an_edit_pair(edit_components):
    """A learning check: the trainer's loss on one fixed pair (the same noise each step) falls
    by 40% within 40 Adam steps of a LoRA on the transformer, the gradient reaching the
    adapters through the reference's tokens and the caption read with it."""
    import copy
    import dataclasses

    from library.networks.lora import LoraSpec, apply_lora, lora_parameters
    from library.training.step import micro_batch_loss

    c = edit_components
    denoiser = copy.deepcopy(c.denoiser)
    apply_lora(denoiser, c.family.adapter_targets(denoiser, "unet", False), LoraSpec(8, 8.0))
    inputs = step_inputs(dataclasses.replace(c, denoiser=denoiser), 3)
    batch = {"captions": CAPTIONS[:1], "loss_weights": torch.ones(1),
             "positions": torch.tensor([0]), "epoch": 0,
             "pixel_values": random_pixels(7, 64, 64)[:1],
             "reference_pixels": [random_pixels(8, 64, 64)[:1]]}  # fmt: skip
    optimizer = torch.optim.Adam(lora_parameters(denoiser), lr=3e-2)
    losses = []
    for _ in range(40):
        loss = micro_batch_loss(inputs, batch)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert losses[-1] < 0.6 * losses[0], losses
