"""Clips through the shared training code on a video VAE in its released layout (Qwen-Image's,
Wan 2.1's network; tiny): a cached clip's posterior is the VAE's encode of the clip's decoded
frames, cached and uncached batches give the same posterior, and the loss over clips of F > 1
frames is the one written out by hand from the VAE, the noise draw and the scheduler."""

from __future__ import annotations

import pytest
import torch
from diffusers import AutoencoderKLQwenImage

from library.config.dataset_schema import DatasetConfig, SubsetConfig
from library.data.dataset import TrainData
from library.data.samples import SampleSource, latent_requests
from library.data.video_decode import decode_frames
from library.training.step import batch_posterior, micro_batch_loss
from tests.kits import videos as kit
from tests.kits.qwenimage.tiny_shapes import tiny_vae_config
from tests.kits.video_latents import VIDEO, hand_ddpm_loss, latent_cache_of, step_inputs

SIZE = (64, 64)  # (width, height)
SEED = 11


@pytest.fixture(scope="module")
def vae():
    torch.manual_seed(0)
    return AutoencoderKLQwenImage(**tiny_vae_config()).eval()


@pytest.fixture(scope="module")
def denoiser(vae):
    torch.manual_seed(1)
    channels = vae.config.z_dim
    return torch.nn.Conv3d(channels, channels, 3, padding=1)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    folder = tmp_path_factory.mktemp("clips")
    kit.write_video(folder / "a.mp4", kit.moving_square(9, SIZE))
    kit.write_video(folder / "b.mp4", kit.moving_square(9, SIZE, reverse=True))
    subset = SubsetConfig(video_directory=str(folder), target_frames=[5], class_tokens="square")
    dataset = DatasetConfig(batch_size=2, resolution=list(SIZE), subsets=[subset])
    return TrainData([dataset], seed=3)


def _inputs(vae, denoiser):
    return step_inputs(VIDEO, vae, denoiser, SEED)


def _encoded(vae, path, frames) -> tuple[torch.Tensor, torch.Tensor]:
    """The VAE's own posterior of a clip's frames as PyAV decodes them."""
    pixels = torch.from_numpy(decode_frames(path, list(frames))).permute(3, 0, 1, 2)
    with torch.no_grad():
        posterior = vae.encode((pixels.float() / 127.5 - 1)[None]).latent_dist
    return posterior.mean[0], posterior.std[0]


@pytest.mark.parametrize("to_disk", [False, True], ids=["memory", "disk"])
def test_a_cached_clip_is_the_vaes_encode_of_its_frames(tmp_path, data, vae, denoiser, to_disk):
    cache = latent_cache_of(data, vae, to_disk)
    requests = latent_requests(data)
    assert sorted(r.frames for r in requests) == [tuple(range(5))] * 2
    for request in requests:
        mean, std = _encoded(vae, request.path, request.frames)
        cached = cache.get(request)
        assert cached.mean.shape == (vae.config.z_dim, 2, 8, 8)  # 1 + (5 - 1) / 4 latent frames
        torch.testing.assert_close(cached.mean.float(), mean, rtol=0, atol=1e-2)  # bf16 cache
        torch.testing.assert_close(cached.std.float(), std, rtol=0, atol=1e-2)
    layout = VIDEO.latent_codec(vae).layout
    (cached_batch,) = list(data.loader(0, 0, source=SampleSource(cache, 1, layout)))
    (pixel_batch,) = list(data.loader(0, 0))
    assert pixel_batch["pixel_values"].shape == (2, 3, 5, SIZE[1], SIZE[0])
    inputs = _inputs(vae, denoiser)
    from_cache, _ = batch_posterior(inputs, cached_batch)
    from_pixels, _ = batch_posterior(inputs, pixel_batch)
    torch.testing.assert_close(from_cache, from_pixels, rtol=0, atol=1e-2)


def test_the_loss_over_clips_is_the_hand_computed_one(data, vae, denoiser):
    (batch,) = list(data.loader(0, 0))
    loss = micro_batch_loss(_inputs(vae, denoiser), batch)
    expected, mean = hand_ddpm_loss(vae, denoiser, batch, SEED)
    assert mean.shape[2] == 2  # two latent frames: the clip's motion is in them
    torch.testing.assert_close(loss, expected, rtol=1e-5, atol=1e-7)
