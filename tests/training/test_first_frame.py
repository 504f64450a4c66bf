"""A sample's first frame as a conditioning input (image-to-video families), through the shared
data path on a video VAE in its released layout (tiny): the cached condition is the VAE's encode
of the clip's first decoded frame followed by zeros, cached and uncached batches agree, an image
is its own condition (nothing more is encoded), and a missing or damaged condition file is
encoded again from the clip, never taken from another entry."""

from __future__ import annotations

import pytest
import torch
from diffusers import AutoencoderKLQwenImage

from library.config.dataset_schema import DatasetConfig, SubsetConfig
from library.data.dataset import TrainData
from library.data.latent_cache import cache_file
from library.data.samples import SampleSource, latent_requests
from library.data.video_decode import decode_frames
from library.models.families.base import FIRST_FRAME_LATENTS_KEY
from library.training.step import batch_posterior, with_first_frame
from tests.data.data_helpers import write_image
from tests.kits import videos as kit
from tests.kits.qwenimage.tiny_shapes import tiny_vae_config
from tests.kits.video_latents import FIRST_FRAME, VIDEO, latent_cache_of, step_inputs

SIZE = (64, 64)  # (width, height)
FRAMES = 5


@pytest.fixture(scope="module")
def vae():
    torch.manual_seed(0)
    return AutoencoderKLQwenImage(**tiny_vae_config()).eval()


def _data(folder, subset: SubsetConfig) -> TrainData:
    return TrainData([DatasetConfig(batch_size=2, resolution=list(SIZE), subsets=[subset])], 3)


@pytest.fixture(scope="module")
def clips(tmp_path_factory):
    folder = tmp_path_factory.mktemp("clips")
    kit.write_video(folder / "a.mp4", kit.moving_square(9, SIZE))
    kit.write_video(folder / "b.mp4", kit.moving_square(9, SIZE, reverse=True))
    subset = SubsetConfig(video_directory=str(folder), target_frames=[FRAMES], class_tokens="sq")
    return _data(folder, subset)


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    folder = tmp_path_factory.mktemp("images")
    write_image(folder / "a.png", (200, 30, 30), SIZE)
    write_image(folder / "b.png", (30, 30, 200), SIZE)
    return _data(folder, SubsetConfig(image_dir=str(folder), class_tokens="sq"))


def _condition_of(vae, path, frames) -> torch.Tensor:
    """The VAE's posterior mean of the clip's first decoded frame then zeros, as diffusers'
    WanImageToVideoPipeline builds its video_condition."""
    first = torch.from_numpy(decode_frames(path, [frames[0]])).permute(3, 0, 1, 2)
    first = first.float() / 127.5 - 1
    padded = torch.cat([first, torch.zeros(3, len(frames) - 1, *first.shape[2:])], dim=1)
    with torch.no_grad():
        return vae.encode(padded[None]).latent_dist.mean[0]


def _condition(vae, batch) -> torch.Tensor:
    inputs = step_inputs(FIRST_FRAME, vae, torch.nn.Identity(), seed=1)
    return with_first_frame(inputs, batch)[FIRST_FRAME_LATENTS_KEY]


@pytest.mark.parametrize("to_disk", [False, True], ids=["memory", "disk"])
def test_a_cached_first_frame_is_the_encode_of_the_first_frame_then_zeros(clips, vae, to_disk):
    cache = latent_cache_of(clips, vae, to_disk, FIRST_FRAME)
    requests = latent_requests(clips, first_frame=True)
    conditions = [r for r in requests if r.first_frame]
    assert len(conditions) == 2 and len(requests) == 4
    for request in conditions:
        expected = _condition_of(vae, request.path, request.frames)
        cached = cache.get(request).mean
        torch.testing.assert_close(cached.float(), expected, rtol=0, atol=1e-2)  # bf16 cache
        clip = cache.get(next(r for r in requests if r.path == request.path and not r.first_frame))
        # the causal VAE's first latent frame sees the first frame alone: the same in both
        torch.testing.assert_close(cached[:, :1].float(), clip.mean[:, :1].float(), atol=1e-2,
                                   rtol=0)  # fmt: skip
        assert not torch.allclose(cached[:, 1:].float(), clip.mean[:, 1:].float(), atol=1e-2)


def test_cached_and_uncached_batches_give_the_same_condition(clips, vae):
    cache = latent_cache_of(clips, vae, False, FIRST_FRAME)
    layout = VIDEO.latent_codec(vae).layout
    source = SampleSource(cache, 1, layout, first_frame=True)
    (cached,) = list(clips.loader(0, 0, source=source))
    (pixels,) = list(clips.loader(0, 0))
    from_cache, from_pixels = _condition(vae, cached), _condition(vae, pixels)
    assert from_cache.shape == (2, vae.config.z_dim, 2, 8, 8)
    torch.testing.assert_close(from_cache, from_pixels, rtol=0, atol=2e-2)


def test_an_image_is_its_own_first_frame(images, vae):
    assert latent_requests(images, first_frame=True) == latent_requests(images)
    cache = latent_cache_of(images, vae, False, FIRST_FRAME)
    layout = VIDEO.latent_codec(vae).layout
    (cached,) = list(images.loader(0, 0, source=SampleSource(cache, 1, layout, first_frame=True)))
    torch.testing.assert_close(cached["first_frame_means"], cached["latent_means"])
    (pixels,) = list(images.loader(0, 0))
    inputs = step_inputs(FIRST_FRAME, vae, torch.nn.Identity(), seed=1)
    own, _ = batch_posterior(inputs, pixels)
    torch.testing.assert_close(_condition(vae, pixels), inputs.codec.to_latents(own))


def test_a_missing_or_damaged_condition_file_is_encoded_again(clips, vae):
    cache = latent_cache_of(clips, vae, True, FIRST_FRAME)
    requests = latent_requests(clips, first_frame=True)
    condition = next(r for r in requests if r.first_frame)
    clip = next(r for r in requests if r.path == condition.path and not r.first_frame)
    assert cache.key(condition) != cache.key(clip)
    before = cache.get(condition).mean.clone()  # not a view of the file rewritten below
    file = cache_file(condition.root, cache.key(condition))
    file.write_bytes(cache_file(clip.root, cache.key(clip)).read_bytes())  # the clip's entry
    with pytest.raises(Exception, match="not made for"):
        cache.get(condition)
    rebuilt = latent_cache_of(clips, vae, True, FIRST_FRAME)
    torch.testing.assert_close(rebuilt.get(condition).mean, before)
    file.unlink()
    rebuilt = latent_cache_of(clips, vae, True, FIRST_FRAME)
    torch.testing.assert_close(rebuilt.get(condition).mean, before)


def test_a_condition_file_lost_during_training_makes_a_stand_in_not_another_entry(clips, vae):
    """The condition's file gone after the build: its sample trains as a zero-weight stand-in
    (a condition of zeros in the right shape), never with another entry's latents."""
    cache = latent_cache_of(clips, vae, True, FIRST_FRAME)
    condition = next(r for r in latent_requests(clips, first_frame=True) if r.first_frame)
    layout = VIDEO.latent_codec(vae).layout
    source = SampleSource(cache, 1, layout, first_frame=True)
    (before,) = list(clips.loader(0, 0, source=source))
    file = cache_file(condition.root, cache.key(condition))
    kept = file.read_bytes()
    file.unlink()
    try:
        (batch,) = list(clips.loader(0, 0, source=source))
    finally:
        file.write_bytes(kept)
    lost = [i for i, readable in enumerate(batch["readable"].tolist()) if not readable]
    assert len(lost) == 1 and batch["loss_weights"][lost[0]] == 0
    assert batch["first_frame_means"].shape == before["first_frame_means"].shape
    assert not batch["first_frame_means"][lost[0]].any()
    assert "is missing" in batch["unreadable"][0]
