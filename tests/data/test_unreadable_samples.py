"""Images that break after the scan: the loaders give stand-ins with loss weight 0 naming the
file (never an exception, which would end one data-loader worker or process alone), and cached
latents do not read the image again."""

from __future__ import annotations

import pytest
import torch
from data_helpers import index_color, write_image

from library.config.dataset_schema import DatasetConfig, SubsetConfig
from library.data.dataset import TrainData
from library.data.latent_cache import LatentCache, cache_file
from library.data.samples import SampleSource, latent_requests, load_for_cache
from library.models.latent_codec import LatentLayout

LATENT_LAYOUT = LatentLayout(4, 8)  # the stand-in VAE below: 4 channels, 8x smaller


def _encode(pixels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A VAE stand-in: 8x8 average pooling, 3 channels + a zero channel; std 1."""
    pooled = torch.nn.functional.avg_pool2d(pixels, 8)
    mean = torch.cat([pooled, torch.zeros_like(pooled[:, :1])], dim=1)
    return mean, torch.ones_like(mean)


def _data(tmp_path, batch_size: int = 2, validation_split: float = 0.0) -> TrainData:
    folder = tmp_path / "1_shape"
    for i in range(4):
        write_image(folder / f"img{i}.png", index_color(i), size=(128, 64))
    subset = SubsetConfig(image_dir=str(folder), class_tokens="shape")
    dataset = DatasetConfig(
        batch_size=batch_size, resolution=[128, 64], subsets=[subset],
        validation_split=validation_split,
    )  # fmt: skip
    return TrainData([dataset], seed=3)


def _batches(data: TrainData, source: SampleSource | None = None, workers: int = 0) -> list[dict]:
    return list(data.loader(0, 0, num_workers=workers, source=source))


def _break(data: TrainData, index: int, how: str = "truncate"):
    path = data.scanned[0].images[index].item.path
    if how == "delete":
        path.unlink()
    else:
        path.write_bytes(path.read_bytes()[:40])
    return path


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("how", ["delete", "truncate"])
def test_a_broken_image_becomes_a_stand_in_with_loss_weight_zero(tmp_path, workers, how):
    data = _data(tmp_path)
    whole = _batches(data)
    broken = _break(data, 1, how)
    batches = _batches(data, workers=workers)
    named = [problem for batch in batches for problem in batch["unreadable"]]
    assert len(named) == 1 and str(broken) in named[0]
    for before, after in zip(whole, batches, strict=True):
        assert before["positions"].tolist() == after["positions"].tolist()
        assert before["captions"] == after["captions"]
        for j, readable in enumerate(after["readable"].tolist()):
            if readable:  # every other sample is exactly what it was
                assert torch.equal(before["pixel_values"][j], after["pixel_values"][j])
                assert before["loss_weights"][j] == after["loss_weights"][j] == 1.0
            else:  # the stand-in: the bucket's shape, nothing in it, and no weight
                assert after["pixel_values"][j].shape == before["pixel_values"][j].shape
                assert not after["pixel_values"][j].any() and after["loss_weights"][j] == 0.0
    assert sum(int((~b["readable"]).sum()) for b in batches) == 1


def test_cached_latents_do_not_read_the_image_again(tmp_path):
    data = _data(tmp_path)
    cache = LatentCache("stand-in", torch.float32, to_disk=False)
    cache.build(latent_requests(data), _encode, load_for_cache, batch_size=2)
    source = SampleSource(cache, latent_layout=LATENT_LAYOUT)
    before = _batches(data, source)
    _break(data, 1, "delete")
    after = _batches(data, source)
    assert all(not batch["unreadable"] for batch in after)
    for a, b in zip(before, after, strict=True):
        assert torch.equal(a["latent_means"], b["latent_means"])


def test_a_cache_file_damaged_after_the_build_becomes_a_stand_in(tmp_path):
    data = _data(tmp_path)
    cache = LatentCache("stand-in", torch.float32, to_disk=True)
    requests = latent_requests(data)
    cache.build(requests, _encode, load_for_cache, batch_size=2)
    file = cache_file(requests[2].root, cache.key(requests[2]))
    file.write_bytes(b"not a safetensors file")
    batches = _batches(data, SampleSource(cache, latent_layout=LATENT_LAYOUT))
    named = [problem for batch in batches for problem in batch["unreadable"]]
    assert len(named) == 1 and str(file) in named[0]
    for batch in batches:
        for j, readable in enumerate(batch["readable"].tolist()):
            assert batch["latent_means"][j].shape == (4, 64 // 8, 128 // 8)
            assert readable or (
                batch["loss_weights"][j] == 0 and not batch["latent_means"][j].any()
            )


def test_a_broken_validation_image_is_marked_unreadable(tmp_path):
    data = _data(tmp_path, batch_size=1, validation_split=0.5)
    held = data.scanned[0].validation[0].item.path
    held.unlink()
    batches = list(data.validation_loader(0))
    marks = [(batch["readable"].tolist(), batch["unreadable"]) for batch in batches]
    assert sum(not r for readable, _ in marks for r in readable) == 1
    assert any(str(held) in problem for _, problems in marks for problem in problems)
