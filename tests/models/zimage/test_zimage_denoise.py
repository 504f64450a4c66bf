"""Z-Image's family (its caption encoding, conditioning and denoiser call, the objective's
timestep input) in a hand-written Euler loop reproduces diffusers' ZImagePipeline latents from
the same seed, with and without guidance; the latent codec decodes as it does."""

from __future__ import annotations

import pytest
import torch

from library.models import caption_lengths
from library.models.families.zimage import denoise
from library.models.families.zimage.family import zimage_family
from library.models.families.zimage.objective import DRAW, ZImageFlowObjective
from library.models.families.zimage.shapes import LATENT_CHANNELS, SCHEDULER_SHIFT
from tests.models.zimage.flow_helpers import euler_step, sampling_sigmas

FAMILY = zimage_family("turbo", SCHEDULER_SHIFT["turbo"])
OBJECTIVE = ZImageFlowObjective(DRAW.options(None))


def conditioning(pipe, *caption_lists):
    """The family's conditioning of the caption lists, each encoded on its own (as the
    pipeline encodes the prompts and the negative prompts), in one batch."""
    rows = []
    for captions in caption_lists:
        text = FAMILY.encode_text((pipe.tokenizer,), (pipe.text_encoder,), captions, "cpu")
        rows += [row[:n] for row, n in zip(text.hidden, text.lengths.tolist(), strict=True)]
    hidden, lengths = caption_lengths.padded(rows)
    text = type(text)(hidden, None, None, lengths=lengths)
    return FAMILY.assemble_conditioning(text, None, "cpu")


def hand_loop(pipe, captions, negatives, size, steps, guidance, seed):
    """Sampling written from the facts: noise from the seed, the shifted linspace sigmas, the
    family's conditioning, one predict per step (with negatives appended for guidance), the
    pipeline's guidance on raw outputs (pos + g * (pos - neg) in float32), Euler."""
    height, width = size
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(len(captions), LATENT_CHANNELS, height // 8, width // 8, generator=g)
    sigmas = sampling_sigmas(steps, SCHEDULER_SHIFT["turbo"])
    with torch.no_grad():
        cond = conditioning(pipe, captions, *([negatives] if guidance > 0 else []))
        for i in range(steps):
            batch = x if guidance == 0 else x.repeat(2, 1, 1, 1)
            t = OBJECTIVE.model_time(sigmas[i].expand(batch.shape[0]))
            raw = FAMILY.predict(pipe.transformer, batch, t, cond)
            if guidance > 0:
                pos, neg = raw[: len(captions)].float(), raw[len(captions) :].float()
                raw = pos + guidance * (pos - neg)
            x = euler_step(x, raw, sigmas[i], sigmas[i + 1])
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
    with pytest.raises(ValueError, match="multiples of 16 pixels"):
        denoise.pack(torch.zeros(1, 16, 5, 6))


def test_latent_codec_decodes_as_the_pipeline(zimage_pipe):
    codec = FAMILY.latent_codec(zimage_pipe.vae)
    with torch.no_grad():
        x = zimage_pipe(
            "a cat",
            height=64,
            width=64,
            num_inference_steps=1,
            guidance_scale=0.0,
            generator=torch.Generator().manual_seed(3),
            output_type="latent",
        ).images
        theirs = zimage_pipe("a cat", height=64, width=64, num_inference_steps=1,
                             guidance_scale=0.0, generator=torch.Generator().manual_seed(3),
                             output_type="pt").images  # fmt: skip
        decoded = zimage_pipe.vae.decode(codec.to_decoder(x)).sample
    ours = zimage_pipe.image_processor.postprocess(decoded, output_type="pt")
    assert torch.equal(ours, theirs)
    assert torch.allclose(codec.to_latents(codec.to_decoder(x)), x, atol=1e-6)
