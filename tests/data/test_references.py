"""Reference (control) images of edit-model datasets: which files pair with each target (as
musubi-tuner pairs them), the sizes they are trained at, how they group into micro-batches, and
the batches that carry them."""

from __future__ import annotations

import json

import pytest
import torch
from data_helpers import index_color, write_image

from library.config.dataset_schema import DatasetConfig, SubsetConfig
from library.data.dataset import TrainData
from library.data.plan import plan_lines
from library.data.references import paired_references
from library.data.samples import SampleSource
from library.errors import ConfigError, DataError


def _pairs(tmp_path, targets, controls):
    image_dir, control_dir = tmp_path / "img", tmp_path / "ctl"
    paths = [write_image(image_dir / name) for name in targets]
    for name in controls:
        write_image(control_dir / name)
    (control_dir / "notes.txt").write_text("not an image")
    pairs = paired_references(paths, str(control_dir))
    return {t.name: [c.name for c in pairs.get(t, ())] for t in paths}


def test_references_pair_by_stem_then_number_in_number_order(tmp_path):
    pairs = _pairs(
        tmp_path,
        ["a.png", "b.jpg", "c.png", "d.png"],
        ["a.jpg", "b_10.png", "b_2.png", "b_0000.webp", "c_1.png", "zzz.png"],
    )
    assert pairs == {
        "a.png": ["a.jpg"],  # any image extension
        "b.jpg": ["b_0000.webp", "b_2.png", "b_10.png"],  # by number, not by name
        "c.png": ["c_1.png"],
        "d.png": [],  # no reference: the scan names it
    }


def test_a_numbered_name_that_is_a_target_stem_belongs_to_that_target(tmp_path):
    pairs = _pairs(tmp_path, ["a.png", "a_1.png"], ["a_1.png", "a_0.png"])
    assert pairs == {"a.png": ["a_0.png"], "a_1.png": ["a_1.png"]}


@pytest.mark.parametrize("controls", [["a.png", "a.jpg"], ["a_1.png", "a_01.png"]])
def test_two_files_taking_one_place_are_an_error_naming_both(tmp_path, controls):
    with pytest.raises(DataError, match=r"are both reference \d of a; rename or remove one"):
        _pairs(tmp_path, ["a.png"], controls)


def test_control_directory_must_exist(tmp_path):
    target = write_image(tmp_path / "img" / "a.png")
    with pytest.raises(DataError, match=r"control_directory .*nope.*fix the path"):
        paired_references([target], str(tmp_path / "nope"))


def test_the_image_folder_as_control_directory_pairs_each_image_with_itself(tmp_path):
    # musubi-tuner trains this ("use same images as control images"); one warning says so
    image_dir = tmp_path / "img"
    for i in range(5):
        write_image(image_dir / f"{i}.png", index_color(i), size=(64, 64))
        (image_dir / f"{i}.txt").write_text(f"edit {i}")
    data = _data(image_dir, image_dir)
    for image in data.scanned[0].images:
        assert [r.path for r in image.references] == [image.item.path]
    (line,) = [w for w in data.warnings if "their own reference" in w]
    assert line.startswith("dataset 0: 5 images are their own reference image")
    assert "img/0.png" in line and "img/4.png" not in line  # the first few names


def test_a_jsonl_line_whose_control_path_is_its_image_gets_the_same_warning(tmp_path):
    write_image(tmp_path / "a.png", size=(64, 64))
    write_image(tmp_path / "b.png", size=(64, 64))
    metadata = tmp_path / "pairs.jsonl"
    records = [
        {"image_path": "a.png", "caption": "x", "control_path": "a.png"},
        {"image_path": "b.png", "caption": "y", "control_path": "a.png"},
    ]
    metadata.write_text("\n".join(json.dumps(r) for r in records))
    config = DatasetConfig(resolution=64, subsets=[SubsetConfig(metadata_file=str(metadata))])
    warnings = TrainData([config], seed=0).warnings
    assert [w for w in warnings if "their own reference" in w] == [
        "dataset 0: 1 images are their own reference image (the same file as target and "
        "control, tmp_path/a.png): each trains an edit that changes nothing, as musubi-tuner "
        "trains it".replace("tmp_path", tmp_path.name)
    ]


def _edit_folder(tmp_path, sizes, control_sizes, captions=True):
    """Targets 0..n-1 of ``sizes`` with one reference each of ``control_sizes``."""
    image_dir, control_dir = tmp_path / "img", tmp_path / "ctl"
    for i, (size, control) in enumerate(zip(sizes, control_sizes, strict=True)):
        write_image(image_dir / f"{i}.png", index_color(i), size=size)
        if captions:
            (image_dir / f"{i}.txt").write_text(f"edit {i}")
        if control is not None:
            write_image(control_dir / f"{i}.png", index_color(i + 20), size=control)
    return image_dir, control_dir


def _data(image_dir, control_dir, batch_size=1, **subset):
    config = DatasetConfig(
        resolution=128,
        batch_size=batch_size,
        enable_bucket=True,
        bucket_reso_steps=16,
        min_bucket_reso=64,
        max_bucket_reso=256,
        subsets=[
            SubsetConfig(image_dir=str(image_dir), control_directory=str(control_dir), **subset)
        ],
    )
    return TrainData([config], seed=0)


def test_by_default_a_reference_is_trained_at_its_targets_bucket(tmp_path):
    image_dir, control_dir = _edit_folder(tmp_path, [(128, 128), (192, 96)], [(40, 30), (50, 50)])
    data = _data(image_dir, control_dir)
    for image in data.scanned[0].images:
        (reference,) = image.references
        assert reference.bucket == image.bucket
        assert reference.path.parent == control_dir


def test_no_resize_control_keeps_the_reference_size_on_the_grid(tmp_path):
    # 100x70 stays (cropped to 96x64 on the 16-px grid); 400x200 is larger than the 128x128
    # area: shrunk to it at its own aspect ratio (181x90.5 -> 176x80)
    image_dir, control_dir = _edit_folder(tmp_path, [(128, 128)] * 2, [(100, 70), (400, 200)])
    data = _data(image_dir, control_dir, no_resize_control=True)
    buckets = sorted(image.references[0].bucket for image in data.scanned[0].images)
    assert buckets == [(96, 64), (176, 80)]
    # with control_resolution too, as musubi-tuner: control_resolution is the largest area kept
    data = _data(image_dir, control_dir, no_resize_control=True, control_resolution=[64, 64])
    buckets = sorted(image.references[0].bucket for image in data.scanned[0].images)
    assert buckets == [(64, 48), (80, 32)]  # 100x70 -> 76.5x53.5; 400x200 -> 90.5x45.3
    assert any("at their own size up to 64x64's area" in line for line in plan_lines(data))


def test_control_resolution_buckets_references_at_its_area(tmp_path):
    image_dir, control_dir = _edit_folder(tmp_path, [(128, 128)], [(400, 200)])
    data = _data(image_dir, control_dir, control_resolution=[96, 96])
    (reference,) = data.scanned[0].images[0].references
    width, height = reference.bucket
    assert width * height <= 96 * 96 and width > height and width % 16 == 0


def test_images_with_other_reference_sizes_never_share_a_micro_batch(tmp_path):
    image_dir, control_dir = _edit_folder(
        tmp_path, [(128, 128)] * 4, [(64, 64), (64, 64), (96, 64), (96, 64)]
    )
    data = _data(image_dir, control_dir, batch_size=2, no_resize_control=True)
    assert sorted(group.references for group in data.groups) == [((64, 64),), ((96, 64),)]
    for batch in data.loader(0, 0, source=SampleSource()):
        (pixels,) = batch["reference_pixels"]  # one tensor per reference slot
        assert pixels.shape[0] == len(batch["captions"]) == 2
        # each sample's reference is its own control image (colors 20 + i)
        for caption, reference in zip(batch["captions"], pixels, strict=True):
            i = int(caption.split()[-1])
            expected = torch.tensor(index_color(i + 20), dtype=torch.float32) / 127.5 - 1
            assert torch.allclose(reference.mean(dim=(1, 2)), expected, atol=1e-2)
    lines = plan_lines(data)
    assert any("references 64x64" in line for line in lines)
    assert any("4 reference images from" in line for line in lines)


def test_an_image_without_its_reference_is_named_or_left_out(tmp_path):
    image_dir, control_dir = _edit_folder(tmp_path, [(128, 128), (128, 128)], [(64, 64), None])
    with pytest.raises(DataError, match=r"1\.png has no reference image in control_directory"):
        _data(image_dir, control_dir)
    config = DatasetConfig(
        resolution=64,
        subsets=[SubsetConfig(image_dir=str(image_dir), control_directory=str(control_dir))],
    )
    data = TrainData([config], seed=0, skip_bad_images=True)
    assert data.num_train_images == 1 and "1.png" in data.skipped_images[0]


def test_an_unreadable_reference_is_named_before_training(tmp_path):
    image_dir, control_dir = _edit_folder(tmp_path, [(128, 128)], [(64, 64)])
    (control_dir / "0.png").write_bytes(b"\x89PNG broken")
    with pytest.raises(DataError, match=r"ctl/0\.png cannot be read"):
        _data(image_dir, control_dir)


def test_control_count_per_image_takes_the_first_and_needs_enough(tmp_path):
    image_dir, control_dir = _edit_folder(tmp_path, [(128, 128)], [(64, 64)])
    write_image(control_dir / "0_1.png", size=(64, 64))
    write_image(control_dir / "0_2.png", size=(64, 64))
    # 0.png, 0_1.png, 0_2.png: the first two
    data = _data(image_dir, control_dir, control_count_per_image=2)
    names = [r.path.name for r in data.scanned[0].images[0].references]
    assert names == ["0.png", "0_1.png"]
    with pytest.raises(DataError, match="has 3 reference images .* control_count_per_image = 4"):
        _data(image_dir, control_dir, control_count_per_image=4)


def test_augmentations_that_would_misalign_a_pair_are_refused(tmp_path):
    image_dir, control_dir = _edit_folder(tmp_path, [(128, 128)], [(64, 64)])
    with pytest.raises(ConfigError, match="random_crop would change an image but not its"):
        _data(image_dir, control_dir, random_crop=True)


def test_musubi_jsonl_names_references_with_control_path_fields(tmp_path):
    image_dir, control_dir = _edit_folder(tmp_path, [(128, 128)] * 2, [(64, 64)] * 2, False)
    write_image(control_dir / "extra.png", size=(64, 64))
    records = [
        {"image_path": "img/0.png", "caption": "one", "control_path": "ctl/0.png"},
        {
            "image_path": str(image_dir / "1.png"),  # absolute paths as written
            "caption": "two",
            "control_path_1": "ctl/extra.png",
            "control_path_0": "ctl/1.png",
        },
    ]
    metadata = tmp_path / "pairs.jsonl"
    metadata.write_text("\n".join(json.dumps(r) for r in records))
    config = DatasetConfig(resolution=64, subsets=[SubsetConfig(metadata_file=str(metadata))])
    data = TrainData([config], seed=0)
    found = {
        image.item.caption: [r.path.name for r in image.references]
        for image in data.scanned[0].images
    }
    assert found == {"one": ["0.png"], "two": ["1.png", "extra.png"]}


def test_a_jsonl_reference_that_is_missing_is_named_with_its_line(tmp_path):
    write_image(tmp_path / "a.png")
    metadata = tmp_path / "pairs.jsonl"
    metadata.write_text(
        json.dumps({"image_path": "a.png", "caption": "x", "control_path": "b.png"})
    )
    config = DatasetConfig(resolution=64, subsets=[SubsetConfig(metadata_file=str(metadata))])
    with pytest.raises(
        DataError, match=r'line 1: image .*b\.png does not exist; fix "control_path"'
    ):
        TrainData([config], seed=0)
