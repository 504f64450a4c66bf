from __future__ import annotations

import pytest
import torch
from data_helpers import index_color, write_image

from library.config.dataset_schema import DatasetConfig, SubsetConfig
from library.data.dataset import TrainData
from library.errors import DataError


def _folders(tmp_path):
    """3 train images (2 captioned) and 2 reg images; returns {color: (caption, is_reg)}."""
    truth = {}
    train, reg = tmp_path / "2_sks dog", tmp_path / "reg" / "1_dog"
    for i in range(3):
        write_image(train / f"img{i}.png", index_color(i), size=(64, 64))
        caption = "sks dog"
        if i < 2:
            caption = f"sks dog, pose {i}"
            (train / f"img{i}.txt").write_text(caption)
        truth[index_color(i)] = (caption, False)
    for i in range(3, 5):
        write_image(reg / f"r{i}.png", index_color(i), size=(64, 64))
        truth[index_color(i)] = ("dog", True)
    subsets = [
        SubsetConfig(image_dir=str(train), class_tokens="sks dog", num_repeats=2),
        SubsetConfig(image_dir=str(reg), class_tokens="dog", num_repeats=1, is_reg=True),
    ]
    return DatasetConfig(batch_size=2, resolution=64, subsets=subsets), truth


def _color_of(pixels: torch.Tensor) -> tuple[int, ...]:
    return tuple(round(v) for v in ((pixels[:, 0, 0] + 1) * 127.5).tolist())


def test_counts_and_metadata(tmp_path):
    config, _ = _folders(tmp_path)
    data = TrainData([config], seed=1, prior_loss_weight=0.25)
    assert (data.num_train_images, data.num_reg_images) == (3, 2)
    assert (data.repeated_train_images, data.repeated_reg_images) == (6, 2)
    assert data.schedule.samples_per_epoch == 12  # 6 train samples + 6 balanced reg samples
    [subset_train, subset_reg] = data.stats.datasets[0].subsets
    assert (subset_train.samples_per_epoch, subset_reg.samples_per_epoch) == (6, 6)
    assert data.tag_frequency() == {
        "2_sks dog": {"sks dog": 3, "pose 0": 1, "pose 1": 1},
        "1_dog": {"dog": 2},
    }
    assert data.dataset_dirs() == {
        "2_sks dog": {"n_repeats": 2, "img_count": 3},
        "1_dog": {"n_repeats": 1, "img_count": 2},
    }
    stats = data.stats
    assert (stats.num_train_images, stats.num_reg_images) == (6, 2)
    assert (stats.train_images, stats.reg_images) == (3, 2)
    assert stats.tag_frequency == data.tag_frequency()
    assert stats.dataset_dirs == data.dataset_dirs()


@pytest.mark.parametrize("num_workers", [0, 2])
def test_loader_batches_match_their_images(tmp_path, num_workers):
    config, truth = _folders(tmp_path)
    data = TrainData([config], seed=3, accumulation=2, world_size=2, prior_loss_weight=0.25)
    seen = []
    for rank in range(2):
        for batch in data.loader(epoch=1, rank=rank, num_workers=num_workers):
            assert batch["pixel_values"].shape == (2, 3, 64, 64)
            assert batch["positions"].dtype == torch.long and batch["epoch"] == 1
            for j in range(2):
                caption, is_reg = truth[_color_of(batch["pixel_values"][j])]
                assert batch["captions"][j] == caption
                weight = batch["loss_weights"][j].item()
                assert weight in ((0.25 if is_reg else 1.0), 0.0)  # 0: a padding slot
                seen.append((int(batch["positions"][j]), caption, is_reg, weight))
    # B_eff 8, 12 samples -> 2 steps, 16 positions split over the two ranks, 4 of them padding.
    assert sorted(p for p, *_ in seen) == list(range(16))
    assert sum(w == 0 for *_, w in seen) == 4
    # every sample counts exactly once: 6 train samples (3 images x 2) and 6 balanced reg ones
    assert sum(1 for _, _, reg, w in seen if w and not reg) == 6
    assert sum(1 for _, _, reg, w in seen if w and reg) == 6


def test_loader_follows_the_schedule_and_start_step(tmp_path):
    config, _ = _folders(tmp_path)
    data = TrainData([config], seed=5, accumulation=1, world_size=1)
    expected = data.schedule.micro_batches(0, 0, start_step=2)
    batches = list(data.loader(0, 0, start_step=2))
    assert [b["positions"].tolist() for b in batches] == [[r.position for r in m] for m in expected]


@pytest.mark.parametrize("num_workers", [0, 2])
def test_one_loader_serves_several_epochs_as_one_loader_each(tmp_path, num_workers):
    """The trainer's run-long loader (its workers start once): epochs 1 to 3 from step 1 of
    epoch 1 give, in order, the batches three loaders of one epoch each give."""
    config, _ = _folders(tmp_path)
    data = TrainData([config], seed=5, accumulation=2, world_size=1, prior_loss_weight=0.25)
    each = [
        *data.loader(1, 0, start_step=1),
        *data.loader(2, 0),
        *data.loader(3, 0),
    ]
    run = list(data.loader(1, 0, start_step=1, num_workers=num_workers, epochs=3))
    assert len(run) == len(each) > 2 * data.schedule.steps_per_epoch  # more than one epoch
    for a, b in zip(run, each, strict=True):
        assert a["epoch"] == b["epoch"] and a["captions"] == b["captions"]
        assert torch.equal(a["positions"], b["positions"])
        assert torch.equal(a["pixel_values"], b["pixel_values"])  # flips and crops keyed alike
    assert [b["epoch"] for b in run][0] == 1 and [b["epoch"] for b in run][-1] == 3


def test_bad_image_stops_before_training(tmp_path):
    config, _ = _folders(tmp_path)
    (tmp_path / "2_sks dog" / "img1.png").write_bytes(b"broken")
    with pytest.raises(DataError, match="img1.png"):
        TrainData([config], seed=1)


def test_dataset_with_only_reg_subsets_is_an_error(tmp_path):
    write_image(tmp_path / "a.png")
    config = DatasetConfig(
        resolution=64,
        subsets=[SubsetConfig(image_dir=str(tmp_path), class_tokens="x", is_reg=True)],
    )
    with pytest.raises(DataError, match="dataset 0.*only regularisation"):
        TrainData([config], seed=1)


def test_an_epoch_too_large_to_list_is_refused_before_it_is_built(tmp_path, monkeypatch):
    """num_repeats = 1e9 over 3 images would list 3e9 samples: refused, naming the key."""
    from library.config.dataset_schema import DatasetConfig as Dataset
    from library.data import dataset as dataset_module
    from library.data.dataset import MAX_EPOCH_SAMPLES
    from library.errors import ConfigError

    config, _ = _folders(tmp_path)
    train = config.subsets[0].model_copy(update={"num_repeats": 1_000_000_000})
    huge = Dataset(batch_size=2, resolution=64, subsets=[train, config.subsets[1]])
    with pytest.raises(ConfigError) as info:
        TrainData([huge], seed=1)
    assert str(info.value) == (
        "datasets[0] would hold 3,000,000,000 samples per epoch (images x num_repeats), more "
        f"than difftune takes ({MAX_EPOCH_SAMPLES:,}); lower datasets[0].subsets[0].num_repeats "
        f"= 1000000000 ({train.image_dir})"
    )
    # at the bound itself the epoch is built (here the bound is 6: 3 images x 2 repeats)
    monkeypatch.setattr(dataset_module, "MAX_EPOCH_SAMPLES", 6)
    assert len(TrainData([config], seed=1).groups[0].samples) >= 6
    three = config.subsets[0].model_copy(update={"num_repeats": 3})
    with pytest.raises(ConfigError, match="^datasets.0. would hold 9 samples"):
        TrainData([Dataset(batch_size=2, resolution=64, subsets=[three])], seed=1)
