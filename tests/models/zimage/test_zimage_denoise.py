"""Z-Image's denoiser call in a hand-written Euler loop reproduces diffusers' ZImagePipeline
latents from the same seed, with and without guidance; the VAE factors decode as it does."""

from __future__ import annotations

import pytest
import torch

from library.models.families.zimage import conditioning, denoise, latents, objective
from library.models.families.zimage.shapes import LATENT_CHANNELS, SCHEDULER_SHIFT


def hand_loop(pipe, captions, negatives, size, steps, guidance, seed):
    """Sampling written from the facts: noise from the seed, the shifted linspace sigmas, the
    caption states, one denoise per step (with negatives appended for guidance), Euler."""
    height, width = size
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(len(captions), LATENT_CHANNELS, height // 8, width // 8, generator=g)
    sigmas = objective.sampling_sigmas(steps, SCHEDULER_SHIFT["turbo"])
    with torch.no_grad():
        states = conditioning.encode_captions(pipe.tokenizer, pipe.text_encoder, captions)
        if guidance > 0:
            states += conditioning.encode_captions(pipe.tokenizer, pipe.text_encoder, negatives)
        for i in range(steps):
            batch = x if guidance == 0 else x.repeat(2, 1, 1, 1)
            t = objective.model_timestep(sigmas[i].expand(batch.shape[0]))
            raw = denoise.denoise(pipe.transformer, batch, t, states)
            if guidance > 0:
                raw = denoise.guided(raw[: len(captions)], raw[len(captions) :], guidance)
            x = objective.euler_step(x, raw, sigmas[i], sigmas[i + 1])
    return x


@pytest.mark.parametrize(
    ("size", "guidance"),
    [((64, 64), 0.0), ((64, 96), 0.0), ((64, 64), 2.0)],
    ids=["square", "wide", "guided"],
)
def test_hand_loop_equals_pipeline_latents(zimage_pipe, size, guidance):
    captions = ["a cat", "the thin red thing in a long caption"]
    theirs = zimage_pipe(
        list(captions),
        height=size[0],
        width=size[1],
        num_inference_steps=2,
        guidance_scale=guidance,
        generator=torch.Generator().manual_seed(7),
        output_type="latent",
    ).images
    ours = hand_loop(zimage_pipe, captions, ["", ""], size, 2, guidance, seed=7)
    assert ours.shape == theirs.shape == (2, LATENT_CHANNELS, size[0] // 8, size[1] // 8)
    assert torch.equal(ours, theirs)


def test_pack_and_unpack():
    x = torch.randn(3, 16, 4, 6)
    packed = denoise.pack(x)
    assert len(packed) == 3 and packed[0].shape == (16, 1, 4, 6)
    assert torch.equal(denoise.unpack(packed), x)
    assert denoise.image_tokens(4, 6) == 6
    with pytest.raises(ValueError, match="multiples of 16 pixels"):
        denoise.pack(torch.zeros(1, 16, 5, 6))


def test_one_caption_state_per_latent(zimage_pipe):
    with pytest.raises(ValueError, match="2 latents but 1 caption states"):
        denoise.denoise(
            zimage_pipe.transformer, torch.zeros(2, 16, 4, 4), torch.ones(2), [torch.zeros(3, 40)]
        )


def test_vae_factors_decode_as_the_pipeline(zimage_pipe):
    generator = torch.Generator().manual_seed(3)
    with torch.no_grad():
        x = zimage_pipe("a cat", height=64, width=64, num_inference_steps=1, guidance_scale=0.0,
                        generator=generator, output_type="latent").images  # fmt: skip
        theirs = zimage_pipe("a cat", height=64, width=64, num_inference_steps=1,
                             guidance_scale=0.0, generator=torch.Generator().manual_seed(3),
                             output_type="pt").images  # fmt: skip
        decoded = zimage_pipe.vae.decode(latents.to_vae_latents(zimage_pipe.vae, x)).sample
    ours = zimage_pipe.image_processor.postprocess(decoded, output_type="pt")
    assert torch.equal(ours, theirs)
    back = latents.to_model_latents(zimage_pipe.vae, latents.to_vae_latents(zimage_pipe.vae, x))
    assert torch.allclose(back, x, atol=1e-6)
