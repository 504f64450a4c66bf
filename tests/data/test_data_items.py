"""Scanning datasets: metadata subsets, bad images left out on request, held-out counts."""

from __future__ import annotations

import json

import pytest
from data_helpers import index_color, write_image

from library.config.dataset_schema import DatasetConfig, SubsetConfig
from library.data.dataset import TrainData
from library.data.plan import plan_lines
from library.errors import ConfigError, DataError


def _folder(tmp_path, count=5):
    folder = tmp_path / "imgs"
    for i in range(count):
        write_image(folder / f"{i}.png", index_color(i), size=(32, 32))
    return folder


def test_metadata_subset_gives_its_captions(tmp_path):
    folder = _folder(tmp_path, 3)
    lines = [json.dumps({"file_name": f"{i}.png", "text": f"caption {i}"}) for i in range(3)]
    (folder / "metadata.jsonl").write_text("\n".join(lines))
    subset = SubsetConfig(metadata_file=str(folder / "metadata.jsonl"), num_repeats=2)
    data = TrainData([DatasetConfig(resolution=64, subsets=[subset])], seed=0)
    captions = sorted(image.item.caption for image in data.scanned[0].images)
    assert captions == ["caption 0", "caption 1", "caption 2"]
    assert data.repeated_train_images == 6


def test_bad_images_stop_the_scan_or_are_left_out_and_counted(tmp_path):
    folder = _folder(tmp_path)
    (folder / "2.png").write_bytes(b"\x89PNG broken")
    config = DatasetConfig(
        resolution=64, subsets=[SubsetConfig(image_dir=str(folder), class_tokens="x")]
    )
    with pytest.raises(DataError, match=r"2\.png cannot be read.*skip_bad_images = true"):
        TrainData([config], seed=0)
    data = TrainData([config], seed=0, skip_bad_images=True)
    assert data.num_train_images == 4 and len(data.skipped_images) == 1
    assert "2.png" in data.skipped_images[0]
    assert any("1 unreadable images left out" in line for line in plan_lines(data))


def test_every_image_bad_is_an_error_even_when_skipping(tmp_path):
    folder = tmp_path / "bad"
    folder.mkdir()
    (folder / "a.png").write_bytes(b"nope")
    config = DatasetConfig(
        resolution=64, subsets=[SubsetConfig(image_dir=str(folder), class_tokens="x")]
    )
    with pytest.raises(DataError, match="no usable images"):
        TrainData([config], seed=0, skip_bad_images=True)


def test_held_out_images_are_not_trained_or_counted(tmp_path):
    folder = _folder(tmp_path, 10)
    reg = _folder(tmp_path / "r", 2)
    config = DatasetConfig(
        resolution=64,
        validation_split=0.2,
        subsets=[
            SubsetConfig(image_dir=str(folder), class_tokens="x", num_repeats=3),
            SubsetConfig(image_dir=str(reg), class_tokens="y", is_reg=True),
        ],
    )
    data = TrainData([config], seed=0)
    assert (data.num_validation_images, data.num_train_images, data.num_reg_images) == (2, 8, 2)
    assert data.repeated_train_images == 24 and data.schedule.samples_per_epoch == 48
    assert all(not image.item.is_reg for image in data.scanned[0].validation)
    assert any("2 images held out for validation" in line for line in plan_lines(data))


def test_conflicting_caption_separators_name_the_subset(tmp_path):
    subset = SubsetConfig(
        image_dir=str(_folder(tmp_path)), class_tokens="x", secondary_separator=","
    )
    with pytest.raises(ConfigError, match=r"datasets\[0\]\.subsets\[0\].*secondary_separator"):
        TrainData([DatasetConfig(resolution=64, subsets=[subset])], seed=0)
