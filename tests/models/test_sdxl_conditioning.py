"""encode_conditioning against the encoders called by hand and diffusers' SDXL pipeline."""

from __future__ import annotations

import copy

import pytest
import torch

from library.config.schema import ModelSection
from library.models.conditioning import (
    Conditioning,
    encode_conditioning,
    freeze_unused_text_adapters,
    plain_sizes,
    size_time_ids,
    unused_text_layers,
)
from library.models.families.sd.family import SD1, SDXL
from library.models.loader import load_components
from library.models.text import encode_prompts

CAPTIONS = ["a red circle on a white background", "shape"]


@pytest.fixture(scope="module")
def sdxl_dir(tiny_sdxl_model_dir):
    return tiny_sdxl_model_dir


@pytest.fixture(scope="module")
def parts(sdxl_dir):
    return load_components(ModelSection(pretrained_model_name_or_path=str(sdxl_dir)), torch.float32)


def _sizes() -> dict[str, torch.Tensor]:
    return {
        "original_sizes": torch.tensor([[480, 640], [1024, 768]]),
        "crop_top_lefts": torch.tensor([[0, 40], [12, 0]]),
        "target_sizes": torch.tensor([[64, 64], [64, 48]]),
    }


def _encode(parts, captions=CAPTIONS, batch=None, **kwargs) -> Conditioning:
    return encode_conditioning(
        parts.family,
        parts.tokenizers,
        parts.text_encoders,
        captions,
        "cpu",
        batch if batch is not None else _sizes(),
        **kwargs,
    )


def _ids(tokenizer, captions):
    return tokenizer(
        captions, padding="max_length", max_length=77, truncation=True, return_tensors="pt"
    ).input_ids


def test_matches_the_encoders_called_by_hand(parts):
    with torch.no_grad():
        cond = _encode(parts)
        first = parts.text_encoder(_ids(parts.tokenizer, CAPTIONS), output_hidden_states=True)
        second = parts.text_encoders[1](_ids(parts.tokenizers[1], CAPTIONS), output_hidden_states=True)
    # Penultimate layers, without the final layer norm, side by side along the channels.
    expected = torch.cat([first.hidden_states[-2], second.hidden_states[-2]], dim=-1)
    assert cond.encoder_hidden_states.shape == (2, 77, 32 + 48)
    torch.testing.assert_close(cond.encoder_hidden_states, expected, rtol=0, atol=0)
    added = cond.unet_kwargs["added_cond_kwargs"]
    assert set(cond.unet_kwargs) == {"added_cond_kwargs"}
    torch.testing.assert_close(added["text_embeds"], second.text_embeds, rtol=0, atol=0)
    time_ids = torch.tensor([[480, 640, 0, 40, 64, 64], [1024, 768, 12, 0, 64, 48]]).float()
    torch.testing.assert_close(added["time_ids"], time_ids, rtol=0, atol=0)


def test_matches_diffusers_sdxl_pipeline(sdxl_dir, parts):
    from diffusers import StableDiffusionXLPipeline

    pipe = StableDiffusionXLPipeline.from_pretrained(sdxl_dir)
    with torch.no_grad():
        embeds, _, pooled, _ = pipe.encode_prompt(
            CAPTIONS, device="cpu", num_images_per_prompt=1, do_classifier_free_guidance=False
        )
        cond = _encode(parts)
    torch.testing.assert_close(cond.encoder_hidden_states, embeds, rtol=0, atol=0)
    torch.testing.assert_close(cond.unet_kwargs["added_cond_kwargs"]["text_embeds"], pooled)
    # Time ids in the pipeline's order: original size, crop top-left, target size.
    projection = pipe.text_encoder_2.config.projection_dim
    theirs = pipe._get_add_time_ids((480, 640), (0, 40), (64, 64), torch.float32, projection)
    mine = cond.unet_kwargs["added_cond_kwargs"]["time_ids"][:1]
    torch.testing.assert_close(mine, theirs, rtol=0, atol=0)


def test_the_unet_takes_it_and_sizes_matter(parts):
    gen = torch.Generator().manual_seed(0)
    latents = torch.randn(2, 4, 8, 8, generator=gen)
    timesteps = torch.tensor([10, 500])
    with torch.no_grad():
        cond = _encode(parts)
        out = parts.denoiser(latents, timesteps, cond.encoder_hidden_states, **cond.unet_kwargs)
        other = _encode(parts, batch=plain_sizes(2, 64, 64))
        moved = parts.denoiser(latents, timesteps, other.encoder_hidden_states, **other.unet_kwargs)
    assert out.sample.shape == latents.shape
    assert (out.sample - moved.sample).abs().max() > 1e-4  # the sizes reach the UNet


def test_plain_sizes():
    sizes = plain_sizes(3, 96, 64)
    expected = torch.tensor([[96, 64, 0, 0, 96, 64]] * 3).float()
    torch.testing.assert_close(size_time_ids(sizes, "cpu"), expected, rtol=0, atol=0)


def test_sd1_is_the_single_encoder_and_no_extra_inputs(tiny_model_dir):
    sd1 = load_components(
        ModelSection(pretrained_model_name_or_path=str(tiny_model_dir)), torch.float32
    )
    with torch.no_grad():
        cond = encode_conditioning(
            sd1.family, sd1.tokenizers, sd1.text_encoders, CAPTIONS, "cpu", clip_skip=2
        )
        expected = encode_prompts(sd1.tokenizer, sd1.text_encoder, CAPTIONS, "cpu", clip_skip=2)
    assert cond.unet_kwargs == {}
    torch.testing.assert_close(cond.encoder_hidden_states, expected, rtol=0, atol=0)


def test_dtype_cast(parts):
    with torch.no_grad():
        cond = _encode(parts, dtype=torch.bfloat16)
    assert cond.encoder_hidden_states.dtype == torch.bfloat16
    assert all(v.dtype == torch.bfloat16 for v in cond.unet_kwargs["added_cond_kwargs"].values())


def test_gradients_reach_adapters_of_both_encoders(parts):
    from library.networks.lora import LoraSpec, apply_lora, lora_layers, randomize_lora

    encoders = [copy.deepcopy(e) for e in parts.text_encoders]
    for encoder in encoders:
        apply_lora(encoder, "text_encoder", LoraSpec(2, 2.0))
        randomize_lora(encoder, torch.Generator().manual_seed(1), std=0.1)
    cond = encode_conditioning(parts.family, parts.tokenizers, encoders, CAPTIONS, "cpu", _sizes())
    pooled = cond.unet_kwargs["added_cond_kwargs"]["text_embeds"]
    (cond.encoder_hidden_states.square().sum() + pooled.square().sum()).backward()
    for index, encoder in enumerate(encoders):
        for path, layer in lora_layers(encoder).items():
            grad = layer.lora_B["default"].weight.grad
            # The first encoder's last layer feeds nothing (its penultimate output is used).
            unused = index == 0 and ".layers.1." in path
            assert (grad is None or not grad.any()) if unused else grad.abs().sum() > 0, path


def test_frozen_encoders_build_no_graph(parts):
    cond = _encode(parts)
    assert not cond.encoder_hidden_states.requires_grad
    assert not cond.unet_kwargs["added_cond_kwargs"]["text_embeds"].requires_grad


def test_wrong_inputs_are_clear(parts):
    with pytest.raises(KeyError, match="original_sizes"):
        _encode(parts, batch={})
    with pytest.raises(ValueError, match="2 text encoders"):
        encode_conditioning(
            parts.family, parts.tokenizers[:1], parts.text_encoders[:1], CAPTIONS, "cpu", _sizes()
        )


def test_unused_text_layers():
    # SDXL: the first encoder's last layer feeds nothing; the pooled encoder uses every layer.
    assert list(unused_text_layers(SDXL, 0, 12)) == [11]
    assert list(unused_text_layers(SDXL, 1, 32)) == []
    # SD 1.x: clip_skip N leaves the last N - 1 layers unused.
    assert list(unused_text_layers(SD1, 0, 12)) == []
    assert list(unused_text_layers(SD1, 0, 12, clip_skip=1)) == []
    assert list(unused_text_layers(SD1, 0, 12, clip_skip=2)) == [11]
    assert list(unused_text_layers(SD1, 0, 12, clip_skip=3)) == [10, 11]


def test_unused_adapters_are_frozen_and_the_rest_trains(parts):
    from library.networks.lora import LoraSpec, apply_lora, lora_layers

    encoders = [copy.deepcopy(e) for e in parts.text_encoders]
    for encoder in encoders:
        apply_lora(encoder, "text_encoder", LoraSpec(2, 2.0))
    frozen = freeze_unused_text_adapters(parts.family, encoders)
    # The tiny first encoder has 2 layers: layer 1's six adapted Linear layers are frozen.
    assert sorted(frozen) == sorted(p for p in lora_layers(encoders[0]) if ".layers.1." in p)
    assert len(frozen) == 6
    for index, encoder in enumerate(encoders):
        for path, layer in lora_layers(encoder).items():
            trains = [p.requires_grad for p in layer.parameters() if p is not None]
            expected = not (index == 0 and path in frozen)
            lora = [layer.lora_A["default"].weight, layer.lora_B["default"].weight]
            assert [w.requires_grad for w in lora] == [expected, expected], path
            assert trains.count(True) == (2 if expected else 0), path
