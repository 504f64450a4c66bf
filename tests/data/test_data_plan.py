from __future__ import annotations

from data_helpers import write_image

from library.config.dataset_schema import DatasetConfig, SubsetConfig
from library.data.dataset import TrainData
from library.data.plan import data_stats, plan_lines


def test_stats_and_lines(tmp_path):
    for i in range(5):
        write_image(tmp_path / "train" / f"{i}.png")
    for i in range(4):
        write_image(tmp_path / "reg" / f"{i}.png")
    write_image(tmp_path / "other" / "0.png")
    first = DatasetConfig(
        batch_size=2,
        resolution=[96, 64],
        subsets=[
            SubsetConfig(image_dir=str(tmp_path / "train"), class_tokens="a", num_repeats=1),
            SubsetConfig(image_dir=str(tmp_path / "reg"), class_tokens="b", is_reg=True),
        ],
    )
    second = DatasetConfig(
        batch_size=1, subsets=[SubsetConfig(image_dir=str(tmp_path / "other"), class_tokens="c")]
    )
    stats = data_stats(TrainData([first, second], seed=0, accumulation=3, world_size=1))

    one, two = stats.datasets
    # dataset 0: 5 train + 5 of 4 reg images balanced (one reg image used twice) = 10 samples;
    # a step holds 2 x 3 = 6 samples -> 2 steps, 2 padding slots.
    assert (one.resolution, one.step_size, one.samples_per_epoch) == ((96, 64), 6, 10)
    assert (one.padded_per_epoch, one.steps_per_epoch, one.micro_batches_per_process) == (2, 2, 6)
    assert [(s.images, s.samples_per_epoch, s.unused_images) for s in one.subsets] == [
        (5, 5, 0),
        (4, 5, 0),
    ]
    # dataset 1: 1 sample, step of 3 -> 1 step, 2 padding slots.
    assert (two.samples_per_epoch, two.padded_per_epoch, two.steps_per_epoch) == (1, 2, 1)
    assert (stats.steps_per_epoch, stats.padded_per_epoch, stats.samples_per_epoch) == (3, 4, 11)
    assert (stats.train_images, stats.reg_images, stats.micro_batches_per_process) == (6, 4, 9)

    lines = plan_lines(stats)
    assert any(line.startswith("  2 padding slots fill the last step") for line in lines)
    assert any(line.startswith("dataset 0: resolution 96x64") for line in lines)
    assert any("(reg): 4 images x 1 repeat, balanced to 5 samples" in line for line in lines)


def test_unused_reg_images_are_reported(tmp_path):
    write_image(tmp_path / "train" / "0.png")
    for i in range(3):
        write_image(tmp_path / "reg" / f"{i}.png")
    config = DatasetConfig(
        subsets=[
            SubsetConfig(image_dir=str(tmp_path / "train"), class_tokens="a", num_repeats=2),
            SubsetConfig(image_dir=str(tmp_path / "reg"), class_tokens="b", is_reg=True),
        ],
    )
    data = TrainData([config], seed=0)
    [_, reg] = data_stats(data).datasets[0].subsets
    assert (reg.samples_per_epoch, reg.unused_images) == (2, 1)
    assert any("(1 images unused)" in line for line in plan_lines(data))


def test_a_long_bucket_histogram_lists_the_largest_and_counts_the_rest():
    from library.data.plan import MAX_BUCKET_LINES, BucketStats, DatasetStats, _bucket_lines

    buckets = tuple(
        BucketStats((64 + 8 * i, 64), 1 + (i == 3), 1 + (i == 3), 1, 3) for i in range(30)
    )
    ds = DatasetStats((512, 512), 4, 4, (), 31, 0, 31, 89, 30, 30, buckets, enable_bucket=True)
    lines = _bucket_lines(ds)
    assert lines[0].startswith("  30 buckets")
    assert len(lines) == 1 + (MAX_BUCKET_LINES - 4) + 1
    assert any(line.strip().startswith("88x64") for line in lines)  # the largest bucket is listed
    assert lines[-1] == "    ... 10 more buckets with 10 images (10 of them smaller than a step)"


def test_tokens_per_sample_are_the_families_patch_tokens(tmp_path):
    """FLUX.1 packs its latents (8x smaller than the image) into 2x2 patches: the tokens are
    pack_latents' sequence; a dataset without buckets prints them on their own line."""
    import torch

    from library.models.families.flux.family import FluxFamily
    from library.models.patch_tokens import pack_latents

    write_image(tmp_path / "train" / "0.png", size=(96, 64))
    config = DatasetConfig(
        resolution=[96, 64], subsets=[SubsetConfig(image_dir=str(tmp_path / "train"))]
    )
    data = TrainData([config], seed=0, tokens_of=FluxFamily.tokens_per_sample)
    packed = pack_latents(torch.zeros(1, 16, 64 // 8, 96 // 8))  # [1, tokens, 64]
    (bucket,) = data.stats.datasets[0].buckets
    assert bucket.tokens == packed.shape[1] == 24
    assert "  24 tokens per sample (the denoiser's sequence)" in plan_lines(data)
    assert TrainData([config], seed=0).stats.datasets[0].buckets[0].tokens is None
