"""Images that train, but not as their files look, are named once per dataset: tiny files
enlarged many times, extreme aspect ratios mostly cropped away (targets and references)."""

from __future__ import annotations

from types import SimpleNamespace

from data_helpers import count_paths, write_image

from library.config.dataset_schema import DatasetConfig, SubsetConfig
from library.data.dataset import TrainData
from library.training.progress import plan_warnings


def _data(tmp_path, sizes, control_sizes=None, **dataset):
    image_dir, control_dir = tmp_path / "img", tmp_path / "ctl"
    for name, size in sizes.items():
        write_image(image_dir / name, size=size)
        (image_dir / name).with_suffix(".txt").write_text(name)
    subset = {"image_dir": str(image_dir)}
    if control_sizes is not None:
        for name, size in control_sizes.items():
            write_image(control_dir / name, size=size)
        subset["control_directory"] = str(control_dir)
    config = DatasetConfig(resolution=64, subsets=[SubsetConfig(**subset)], **dataset)
    return TrainData([config], seed=0)


def test_tiny_and_extreme_images_are_named_and_ordinary_ones_are_not(tmp_path):
    # trained at 64x64 (no buckets), covered then center-cropped:
    # 1x1 is enlarged 64x; 20000x20 is enlarged 3.2x and keeps 64*64 / (64000*64) of its area;
    # 200x100 keeps exactly half (not less); 16x16 is enlarged exactly 4x (not more)
    sizes = {
        "a.png": (1, 1),
        "b.png": (20000, 20),
        "c.png": (200, 100),
        "d.png": (16, 16),
        "e.png": (64, 64),
    }
    warnings = _data(tmp_path, sizes).warnings
    assert len(warnings) == 2
    enlarged, cropped = warnings
    assert enlarged.startswith("dataset 0: 1 images or references are enlarged more than 4x")
    assert "(img/a.png)" in enlarged
    assert cropped.startswith("dataset 0: 1 images or references lose more than half")
    assert "(img/b.png)" in cropped


def test_references_are_named_too(tmp_path):
    data = _data(tmp_path, {"a.png": (64, 64)}, {"a.png": (1, 1), "a_0.png": (20, 20000)})
    enlarged, cropped = data.warnings
    assert "(ctl/a.png)" in enlarged and "(ctl/a_0.png)" in cropped


def test_the_plan_prints_them_as_warnings(tmp_path):
    data = _data(tmp_path, {"a.png": (1, 1)})
    trainer = SimpleNamespace(data=data, size_notes=(), family_notes=())
    assert plan_warnings(trainer) == list(data.warnings) != []


def test_only_the_names_shown_are_made_into_paths(tmp_path, monkeypatch):
    # a dataset of small files, every one of them enlarged: the warning counts them all and
    # names three, and a folder's images make a Path only for a name it shows
    count = 40
    data = _data(tmp_path, {f"{i:02d}.png": (2, 2) for i in range(count)})
    made = count_paths(monkeypatch)
    (enlarged,) = data.warnings
    assert enlarged.startswith(f"dataset 0: {count} images or references are enlarged")
    assert "(img/00.png, img/01.png, img/02.png, ...)" in enlarged
    assert len(made) < 10, len(made)
