"""TrainData with buckets, caches, caption operations and validation, end to end on the data side."""

from __future__ import annotations

import re
from collections import Counter

import torch
from data_helpers import index_color

from library.config.dataset_schema import DatasetConfig, SubsetConfig
from library.data.dataset import TrainData
from library.data.latent_cache import LatentCache
from library.data.plan import plan_lines
from library.data.samples import SampleSource, latent_requests, load_for_cache

# Resolution 128, buckets 64..256 in steps of 64: the widths 64, 128, 192, 256 give the tallest
# heights within area 128 x 128 and side 256: 256, 128, 64, 64, so the buckets (both orientations)
# are 64x192, 64x256, 128x128, 192x64, 256x64. Each image goes to the nearest aspect ratio in log
# space (1:2 is log 2 = 0.69 from 1:1 and 1:4, but only log 1.5 = 0.41 from 1:3).
MIXED = {  # image (width, height) -> expected bucket
    (64, 64): (128, 128),
    (96, 96): (128, 128),
    (60, 120): (64, 192),
    (90, 180): (64, 192),
    (120, 60): (192, 64),
    (40, 160): (64, 256),
}


def _write_half_image(path, i: int, size) -> None:
    """Left half in image i's color, right half black: the index and any flip can be read back."""
    from PIL import Image

    width, height = size
    image = Image.new("RGB", size, (0, 0, 0))
    image.paste(index_color(i), (0, 0, width // 2, height))
    path.parent.mkdir(parents=True, exist_ok=True)
    image.save(path)


def _index_from_red(red: float) -> int:
    return round((red + 1) * 127.5 / 5)


def _dataset(tmp_path, repeats=2, batch_size=2, **subset_keys) -> DatasetConfig:
    folder = tmp_path / "imgs"
    for i, size in enumerate(MIXED):
        _write_half_image(folder / f"{i:02d}.png", i, size)
        (folder / f"{i:02d}.txt").write_text(f"img{i}, red{i}, green{i}, blue{i}")
    subset = SubsetConfig(image_dir=str(folder), num_repeats=repeats, **subset_keys)
    return DatasetConfig(
        batch_size=batch_size,
        resolution=128,
        enable_bucket=True,
        min_bucket_reso=64,
        max_bucket_reso=256,
        bucket_reso_steps=64,
        subsets=[subset],
    )


def _all_batches(data: TrainData, epoch: int, source=None) -> list[dict]:
    return [
        batch
        for rank in range(data.world_size)
        for batch in data.loader(epoch, rank, source=source)
    ]


def test_buckets_hold_the_expected_images_each_counted_exactly_its_repeats(tmp_path):
    config = _dataset(tmp_path, repeats=3)
    expected = list(MIXED.values())
    for world_size, accumulation in ((1, 2), (2, 1)):
        data = TrainData([config], seed=11, accumulation=accumulation, world_size=world_size)
        counts, positions = Counter(), []
        for batch in _all_batches(data, epoch=1):
            height, width = batch["pixel_values"].shape[-2:]
            for j, caption in enumerate(batch["captions"]):
                i = int(caption.split(",")[0].removeprefix("img"))
                assert (width, height) == expected[i]  # one bucket per batch, the image's own
                assert _index_from_red(batch["pixel_values"][j, 0, :, 0].mean().item()) == i
                counts[i] += batch["loss_weights"][j].item() > 0
                positions.append(int(batch["positions"][j]))
        assert counts == {i: 3 for i in range(len(MIXED))}, (world_size, counts)
        assert sorted(positions) == list(range(len(positions)))


def test_plan_prints_the_bucket_histogram_and_padding(tmp_path):
    data = TrainData([_dataset(tmp_path, repeats=1)], seed=0, world_size=2)
    text = "\n".join(plan_lines(data))
    assert "4 buckets" in text
    # 128x128 holds 2 images (2 samples) and a step holds 2 x 2 = 4: it is padded by 2 slots
    assert re.search(r"128x128 +2 images +2 samples +1 steps #+ +\(smaller than a step", text)
    assert "(smaller than a step: 2 padding slots)" in text
    assert "loss weight 0" in text


def _stand_in_encode(pixels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A VAE stand-in: 8x8 average pooling (3 channels + a zero channel); std 1."""
    pooled = torch.nn.functional.avg_pool2d(pixels, 8)
    mean = torch.cat([pooled, torch.zeros_like(pooled[:, :1])], dim=1)
    return mean, torch.ones_like(mean)


def test_cached_latents_pair_with_their_own_captions_and_flips(tmp_path):
    config = _dataset(tmp_path, shuffle_caption=True, flip_aug=True, caption_tag_dropout_rate=0.3)
    data = TrainData([config], seed=5, world_size=2)
    cache = LatentCache("stand-in", torch.float32, to_disk=True)
    stats = cache.build(latent_requests(data), _stand_in_encode, load_for_cache, batch_size=2)
    assert stats.encoded_here == 2 * len(MIXED)  # both sides of every image
    flips = 0
    for epoch in range(3):
        for batch in _all_batches(data, epoch, SampleSource(cache)):
            means = batch["latent_means"]
            for j, caption in enumerate(batch["captions"]):
                # every tag names its image; shuffling and dropout must keep them with it
                owners = {int(n) for n in re.findall(r"[a-z]+(\d+)", caption)}
                left, right = means[j, 0, :, 0].mean().item(), means[j, 0, :, -1].mean().item()
                flipped = left < right  # the colored half moved to the right
                colored = right if flipped else left
                assert owners <= {_index_from_red(colored)}, caption
                flips += flipped
    assert flips > 0
    again = LatentCache("stand-in", torch.float32, to_disk=True)
    assert again.build(latent_requests(data), _stand_in_encode, load_for_cache, 2).encoded_here == 0


def test_validation_split_is_disjoint_and_the_same_for_any_process_count(tmp_path):
    config = _dataset(tmp_path, repeats=1).model_copy(update={"validation_split": 0.34})
    held = []
    for world_size in (1, 2):
        data = TrainData([config], seed=3, world_size=world_size)
        scanned = data.scanned[0]
        validation = {image.key for image in scanned.validation}
        assert len(validation) == 2
        assert validation.isdisjoint(image.key for image in scanned.images)
        keys = [
            key
            for rank in range(world_size)
            for batch in data.validation_loader(rank)
            for key in batch["validation_keys"]
        ]
        # each validation image once over the ranks (keys carry their dataset index)
        assert sorted(keys) == sorted(f"0:{key}" for key in validation)
        held.append(validation)
    assert held[0] == held[1]
