"""Latent codecs against hand computations from the VAEs' config values and diffusers' own
pipeline formulas: SD's, FLUX.1's and SD3's AutoencoderKL (scale, and shift), and a video VAE
normalised per channel (a tiny AutoencoderKLQwenImage)."""

from __future__ import annotations

import pytest
import torch
from diffusers import AutoencoderKL, AutoencoderKLQwenImage

from library.models.families.flux.family import FLUX_DEV
from library.models.families.sd.family import SD1, SDXL
from library.models.families.sd3.family import SD35_MEDIUM
from library.models.latent_codec import LatentLayout, ScaledLatentCodec
from library.models.video_latent_codec import ChannelNormalizedVideoCodec
from tests.kits.flux.tiny_shapes import tiny_ae_config
from tests.kits.sd.tiny import tiny_vae_config
from tests.kits.sd3.tiny_shapes import tiny_vae_config as sd3_tiny_vae_config

# (family, VAE kwargs, scaling_factor, shift_factor): the factors written out as the released
# VAE configs carry them, so the hand computations below do not read them through any codec.
SCALED_VAES = {
    "sd": (SD1, tiny_vae_config(), 0.18215, None),
    "flux": (FLUX_DEV, tiny_ae_config(), 0.3611, 0.1159),
    "sd3": (SD35_MEDIUM, sd3_tiny_vae_config(), 1.5305, 0.0609),
}
# A video VAE with per-channel statistics far from 0 and 1, so a swapped mean and std shows.
VIDEO_MEAN = [0.5, -1.25, 2.0, -0.75]
VIDEO_STD = [1.5, 0.25, 3.0, 0.8]


def _pixels(batch: int, height: int, width: int, seed: int = 0) -> torch.Tensor:
    return (
        torch.rand(batch, 3, height, width, generator=torch.Generator().manual_seed(seed)) * 2 - 1
    )


def _seeded(build, **kwargs):
    torch.manual_seed(0)
    return build(**kwargs).eval()


@pytest.fixture(scope="module", params=sorted(SCALED_VAES))
def scaled(request):
    family, config, scale, shift = SCALED_VAES[request.param]
    return family, _seeded(AutoencoderKL, **config), scale, shift


@pytest.fixture(scope="module")
def video_vae():
    return _seeded(
        AutoencoderKLQwenImage,
        base_dim=8,
        z_dim=4,
        dim_mult=[1, 2, 2],
        num_res_blocks=1,
        temperal_downsample=[False, True],  # two levels: 4x smaller sides
        latents_mean=VIDEO_MEAN,
        latents_std=VIDEO_STD,
    )


def test_the_released_factors_are_in_the_tiny_configs(scaled):
    _, vae, scale, shift = scaled
    assert vae.config.scaling_factor == scale
    assert getattr(vae.config, "shift_factor", None) == shift


def test_families_default_to_the_scaled_codec_over_their_vae(scaled):
    family, vae, _, _ = scaled
    codec = family.latent_codec(vae)
    assert isinstance(codec, ScaledLatentCodec) and codec.vae is vae


def test_scaled_latents_are_the_config_formula_bit_for_bit(scaled):
    family, vae, scale, shift = scaled
    sample = torch.randn(2, vae.config.latent_channels, 4, 6)
    expected = (sample - shift) * scale if shift else sample * scale
    assert torch.equal(family.latent_codec(vae).to_latents(sample), expected)


def test_scaled_decoder_input_is_the_pipelines_formula(scaled):
    family, vae, scale, shift = scaled
    latents = torch.randn(2, vae.config.latent_channels, 4, 6)
    codec = family.latent_codec(vae)
    # diffusers' pipelines: latents / scaling_factor (+ shift_factor where the VAE has one)
    expected = latents / scale + (shift or 0.0)
    torch.testing.assert_close(codec.to_decoder(latents), expected, rtol=0, atol=1e-6)
    torch.testing.assert_close(codec.to_decoder(codec.to_latents(latents)), latents)


def test_scaled_posterior_is_the_vaes_own_and_its_shape_the_layouts(scaled):
    family, vae, _, _ = scaled
    pixels = _pixels(2, 48, 32)
    codec = family.latent_codec(vae)
    mean, std = codec.posterior(pixels)
    with torch.no_grad():
        posterior = vae.encode(pixels).latent_dist
    assert torch.equal(mean, posterior.mean) and torch.equal(std, posterior.std)
    assert mean.dtype == std.dtype == torch.float32 and not mean.requires_grad
    channels = vae.config.latent_channels
    assert codec.layout == LatentLayout(channels, 8)
    assert tuple(mean.shape) == codec.layout.shape(2, 48, 32) == (2, channels, 6, 4)


def test_the_posterior_runs_in_the_vaes_dtype_under_autocast():
    vae = _seeded(AutoencoderKL, **tiny_vae_config())
    codec = SDXL.latent_codec(vae)
    pixels = _pixels(1, 32, 32)
    plain = codec.posterior(pixels)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        under_autocast = codec.posterior(pixels)
    for a, b in zip(plain, under_autocast, strict=True):
        assert torch.equal(a, b)


def test_layout_shapes_and_dimensions():
    image, video = LatentLayout(16, 8), LatentLayout(16, 8, inner_axes=(1,))
    assert image.shape(3, 64, 128) == (3, 16, 8, 16) and image.sample_dims == 3
    assert video.shape(3, 64, 128) == (3, 16, 1, 8, 16) and video.sample_dims == 4


def test_video_posterior_is_the_vaes_on_one_frame_clips(video_vae):
    codec = ChannelNormalizedVideoCodec(video_vae)
    pixels = _pixels(2, 32, 48)
    mean, std = codec.posterior(pixels)
    with torch.no_grad():
        posterior = video_vae.encode(pixels[:, :, None]).latent_dist
    assert torch.equal(mean, posterior.mean) and torch.equal(std, posterior.std)
    assert codec.layout == LatentLayout(4, 4, inner_axes=(1,), frame_factor=2)
    assert tuple(mean.shape) == codec.layout.shape(2, 32, 48) == (2, 4, 1, 8, 12)


def _clip(batch: int, frames: int, height: int, width: int, seed: int = 0) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.rand(batch, 3, frames, height, width, generator=generator) * 2 - 1


@pytest.fixture(scope="module")
def released_video_vae():
    """Qwen-Image's VAE (Wan 2.1's network) in its released layout: diffusers' encoder reads a
    clip as its first frame and then chunks of four, so clips need its temporal factor 4."""
    from tests.kits.qwenimage.tiny_shapes import tiny_vae_config as qwen_tiny_vae_config

    return _seeded(AutoencoderKLQwenImage, **qwen_tiny_vae_config())


@pytest.mark.parametrize("frames", [5, 9])
def test_video_posterior_of_a_clip_is_the_vaes_and_its_shape_the_layouts(
    released_video_vae, frames
):
    codec = ChannelNormalizedVideoCodec(released_video_vae)
    clips = _clip(1, frames, 16, 16)
    mean, std = codec.posterior(clips)
    with torch.no_grad():
        posterior = released_video_vae.encode(clips).latent_dist
    assert torch.equal(mean, posterior.mean) and torch.equal(std, posterior.std)
    # the VAE's own output frame count, not the layout's formula, is what the layout must give
    assert tuple(mean.shape) == codec.layout.shape(1, 16, 16, frames=frames)
    assert codec.layout.frame_factor == 4 and mean.shape[2] == 1 + (frames - 1) // 4


def test_a_clip_the_vae_cannot_fold_is_named_and_an_image_layout_takes_no_clips(video_vae):
    codec = ChannelNormalizedVideoCodec(video_vae)
    with pytest.raises(ValueError, match=r"4 frames cannot be encoded.*1 \+ a multiple of 2"):
        codec.posterior(_clip(1, 4, 32, 48))
    image = LatentLayout(16, 8)
    assert not image.takes_clips and image.shape(1, 64, 64, frames=1) == (1, 16, 8, 8)
    with pytest.raises(ValueError, match="single images, not clips of 5 frames"):
        image.shape(1, 64, 64, frames=5)


def test_video_latents_are_normalised_per_channel_by_hand(video_vae):
    codec = ChannelNormalizedVideoCodec(video_vae)
    mean, std = codec.posterior(_pixels(2, 32, 48, seed=1))
    sample = mean + std * torch.randn(mean.shape, generator=torch.Generator().manual_seed(2))
    latents = codec.to_latents(sample)
    for c in range(4):  # (z - latents_mean) / latents_std, one channel at a time
        expected = (sample[:, c] - VIDEO_MEAN[c]) / VIDEO_STD[c]
        torch.testing.assert_close(latents[:, c], expected, rtol=1e-6, atol=1e-6)


def test_video_decoder_input_is_the_pipelines_formula_and_decodes(video_vae):
    codec = ChannelNormalizedVideoCodec(video_vae)
    latents = torch.randn(2, 4, 1, 8, 12, generator=torch.Generator().manual_seed(3))
    # QwenImagePipeline: latents_std = 1 / std; latents = latents / latents_std + latents_mean
    inverse_std = 1.0 / torch.tensor(VIDEO_STD).view(1, 4, 1, 1, 1)
    expected = latents / inverse_std + torch.tensor(VIDEO_MEAN).view(1, 4, 1, 1, 1)
    decoder_input = codec.to_decoder(latents)
    torch.testing.assert_close(decoder_input, expected, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(codec.to_latents(decoder_input), latents, rtol=1e-5, atol=1e-5)
    with torch.no_grad():
        assert video_vae.decode(decoder_input).sample.shape == (2, 3, 1, 32, 48)


def test_wan22_vae_clip_latents_have_the_shape_its_layout_gives():
    """Wan 2.2's VAE (TI2V-5B's) folds 2x2 pixel patches before its 8x downsampling: the layout
    takes its config's 16 and the posterior is the VAE's own."""
    from diffusers import AutoencoderKLWan

    from tests.kits.wan.tiny import ti2v_vae_config

    vae = _seeded(AutoencoderKLWan, **ti2v_vae_config())
    codec = ChannelNormalizedVideoCodec(vae)
    clips = _clip(1, 5, 32, 64)
    mean, std = codec.posterior(clips)
    with torch.no_grad():
        posterior = vae.encode(clips).latent_dist
    assert torch.equal(mean, posterior.mean) and torch.equal(std, posterior.std)
    assert tuple(mean.shape) == codec.layout.shape(1, 32, 64, frames=5) == (1, 48, 2, 2, 4)
