"""The memory estimate counts a clip's frames: the largest training size is the bucket with the
most pixels over all its frames, the meta latents have the latent frames the VAE itself gives a
clip, and the VAE's encoding of a clip holds more than of one frame."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from diffusers import AutoencoderKLQwenImage

from library.data.plan import BucketStats, DatasetStats
from library.models.video_latent_codec import ChannelNormalizedVideoCodec
from library.training.memory_estimate import training_sizes
from library.training.meta_activations import TrainingSize, _noisy_latents, encoding_bytes
from tests.kits.qwenimage.tiny_shapes import tiny_vae_config


@pytest.fixture(scope="module")
def vae():
    torch.manual_seed(0)
    return AutoencoderKLQwenImage(**tiny_vae_config()).eval()


def _components(vae):
    """What the estimate reads of a video family: its codec over the VAE, and noise levels."""
    family = SimpleNamespace(latent_codec=ChannelNormalizedVideoCodec)
    objective = SimpleNamespace(
        level_tensor=lambda levels, device: torch.zeros(1, device=device),
        validation_levels=lambda n: [0.5],
    )
    return SimpleNamespace(vae=vae, family=family, objective=objective)


def test_the_meta_latents_of_a_clip_have_the_vaes_latent_frames(vae):
    comps = _components(vae)
    latents, _ = _noisy_latents(comps, TrainingSize(32, 16, 2, frames=9), torch.bfloat16)
    with torch.no_grad():
        encoded = vae.encode(torch.zeros(2, 3, 9, 16, 32)).latent_dist.mean
    assert tuple(latents.shape) == tuple(encoded.shape)  # the VAE's own count: 1 + 8 / 4


def test_a_clips_encoding_holds_more_than_one_frames(vae):
    parts = SimpleNamespace(components=_components(vae))
    one = encoding_bytes(parts, TrainingSize(32, 16, 1), 1)
    clip = encoding_bytes(parts, TrainingSize(32, 16, 1, frames=9), 1)
    assert clip > 2 * one


def _dataset(buckets):
    return DatasetStats(
        resolution=(64, 64), batch_size=2, step_size=2, subsets=(), train_images=0,
        reg_images=0, samples_per_epoch=0, padded_per_epoch=0, steps_per_epoch=0,
        micro_batches_per_process=0, buckets=tuple(buckets),
    )  # fmt: skip


def test_the_largest_training_size_counts_every_frame():
    image = BucketStats((96, 64), 4, 4, 2, 0)
    clip = BucketStats((64, 48), 2, 2, 1, 0, frames=5)  # fewer pixels a frame, more in all
    stats = SimpleNamespace(datasets=(_dataset([image, clip]),))
    assert training_sizes(stats) == [TrainingSize(64, 48, 2, (), 5)]
    stats = SimpleNamespace(datasets=(_dataset([image, BucketStats((64, 48), 2, 2, 1, 0)]),))
    assert training_sizes(stats) == [TrainingSize(96, 64, 2)]


def test_the_memory_line_names_a_clips_frames():
    from library.training.memory_check import estimate_line
    from library.training.memory_estimate import MemoryEstimate

    def line(size):
        found = MemoryEstimate(1 << 30, 1 << 29, 1 << 28, size, checkpointing=False)
        return estimate_line(found, torch.device("cpu"), None)

    assert "at 64x48 (5 frames) x 2," in line(TrainingSize(64, 48, 2, frames=5))
    assert "at 64x48 x 2," in line(TrainingSize(64, 48, 2))
