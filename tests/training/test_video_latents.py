"""The shared training code carries a family whose latent codec is 5-D: a stand-in family over a
tiny video VAE (AutoencoderKLQwenImage, latents [B, C, 1, h, w] normalised per channel) trains,
validates, caches latents and sizes its memory estimate without assuming [B, C, h, w] latents
or AutoencoderKL's scale and shift.

Its twin reads the same VAE through a codec that drops the frame axis; with one frame both must
compute the very same numbers, noise options and alpha masks included."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from diffusers import AutoencoderKLQwenImage, DDPMScheduler
from PIL import Image

from library.config.dataset_schema import DatasetConfig, SubsetConfig
from library.data.dataset import TrainData
from library.data.latent_cache import cache_file
from library.data.samples import SampleSource, latent_requests
from library.training.meta_activations import TrainingSize, _noisy_latents
from library.training.noise import NoiseOptions
from library.training.objectives import DDPMObjective
from library.training.step import batch_posterior, micro_batch_loss
from library.training.validation import batch_validation_loss
from tests.kits.video_latents import TWIN, VIDEO, hand_ddpm_loss, latent_cache_of, step_inputs

CHANNELS, FACTOR = 4, 4
SEED = 5
ALL_NOISE = NoiseOptions(
    noise_offset=0.1,
    adaptive_noise_scale=0.05,
    multires_noise_iterations=3,
    ip_noise_gamma=0.1,
)


@pytest.fixture(scope="module")
def vae():
    torch.manual_seed(0)
    return AutoencoderKLQwenImage(
        base_dim=8,
        z_dim=CHANNELS,
        dim_mult=[1, 2, 2],
        num_res_blocks=1,
        temperal_downsample=[False, True],
        latents_mean=[0.5, -1.25, 2.0, -0.75],
        latents_std=[1.5, 0.25, 3.0, 0.8],
    ).eval()


@pytest.fixture(scope="module")
def denoiser():
    torch.manual_seed(1)
    return torch.nn.Conv3d(CHANNELS, CHANNELS, (1, 3, 3), padding=(0, 1, 1))


def _inputs(family, vae, denoiser, noise=None):
    return step_inputs(family, vae, denoiser, SEED, noise)


def _batch(masked: bool = False) -> dict:
    gen = torch.Generator().manual_seed(4)
    batch = {
        "pixel_values": torch.rand(2, 3, 32, 48, generator=gen) * 2 - 1,
        "captions": ["a", "b"],
        "loss_weights": torch.tensor([1.0, 0.5]),
        "positions": torch.tensor([3, 8]),
        "epoch": 1,
        "validation_keys": ["0:a", "0:b"],
    }
    if masked:
        batch["alpha_masks"] = torch.rand(2, 1, 32, 48, generator=gen)
    return batch


def test_the_posterior_of_pixels_has_the_frame_axis(vae, denoiser):
    batch = _batch()
    mean, std = batch_posterior(_inputs(VIDEO, vae, denoiser), batch)
    with torch.no_grad():
        posterior = vae.encode(batch["pixel_values"][:, :, None]).latent_dist
    assert torch.equal(mean, posterior.mean) and torch.equal(std, posterior.std)
    assert tuple(mean.shape) == (2, CHANNELS, 1, 32 // FACTOR, 48 // FACTOR)


def test_the_loss_is_the_hand_computed_one_over_5d_latents(vae, denoiser):
    batch = _batch()
    loss = micro_batch_loss(_inputs(VIDEO, vae, denoiser), batch)
    expected, _ = hand_ddpm_loss(vae, denoiser, batch, SEED)
    torch.testing.assert_close(loss, expected, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("noise", [NoiseOptions(), ALL_NOISE], ids=["plain", "all-noise"])
@pytest.mark.parametrize("masked", [False, True], ids=["", "masked"])
def test_5d_latents_train_exactly_as_their_frame_dropped_twin(vae, denoiser, noise, masked):
    batch = _batch(masked)
    video = micro_batch_loss(_inputs(VIDEO, vae, denoiser, noise), batch)
    twin = micro_batch_loss(_inputs(TWIN, vae, denoiser, noise), batch)
    torch.testing.assert_close(video, twin, rtol=1e-6, atol=0)
    if masked:  # the mask reached the loss
        unmasked = micro_batch_loss(_inputs(VIDEO, vae, denoiser, noise), _batch())
        assert not torch.allclose(video, unmasked)


@pytest.mark.parametrize("masked", [False, True], ids=["", "masked"])
def test_5d_validation_loss_equals_the_twins(vae, denoiser, masked):
    batch = _batch(masked)
    video, terms = batch_validation_loss(_inputs(VIDEO, vae, denoiser), batch, (100, 700), SEED)
    twin, _ = batch_validation_loss(_inputs(TWIN, vae, denoiser), batch, (100, 700), SEED)
    assert terms == 4
    torch.testing.assert_close(video, twin, rtol=1e-6, atol=0)


def _data(tmp_path) -> TrainData:
    folder = tmp_path / "1_shape"
    folder.mkdir()
    for i in range(3):
        Image.new("RGB", (96, 64), (40 * i, 200 - 30 * i, 90)).save(folder / f"img{i}.png")
    dataset = DatasetConfig(
        batch_size=2, resolution=[96, 64], subsets=[SubsetConfig(image_dir=str(folder))]
    )
    return TrainData([dataset], seed=3)


@pytest.mark.parametrize("to_disk", [False, True], ids=["memory", "disk"])
def test_the_latent_cache_holds_and_serves_5d_posteriors(tmp_path, vae, denoiser, to_disk):
    data = _data(tmp_path)
    cache = latent_cache_of(data, vae, to_disk)
    layout = VIDEO.latent_codec(vae).layout
    batches = list(data.loader(0, 0, source=SampleSource(cache, 1, layout)))
    assert batches and all(not b["unreadable"] for b in batches)
    inputs = _inputs(VIDEO, vae, denoiser)
    for batch in batches:
        assert batch["latent_means"].shape == layout.shape(len(batch["captions"]), 64, 96)
        assert torch.isfinite(micro_batch_loss(inputs, batch))
    if to_disk:  # a file that breaks now gives a stand-in of the layout's shape
        for request in latent_requests(data):
            cache_file(request.root, cache.key(request)).write_bytes(b"broken")
        batch = next(iter(data.loader(0, 0, source=SampleSource(cache, 1, layout))))
        assert batch["unreadable"] and batch["latent_means"].shape == layout.shape(2, 64, 96)


def test_the_memory_estimate_runs_the_denoiser_on_5d_meta_latents(vae):
    comps = SimpleNamespace(
        vae=vae, family=VIDEO, objective=DDPMObjective(DDPMScheduler(), v_prediction=False)
    )
    latents, levels = _noisy_latents(
        comps, TrainingSize(width=96, height=64, batch=3), torch.bfloat16
    )
    assert latents.device.type == "meta" and latents.dtype == torch.bfloat16
    assert tuple(latents.shape) == (3, CHANNELS, 1, 64 // FACTOR, 96 // FACTOR)
    assert tuple(levels.shape) == (3,)
