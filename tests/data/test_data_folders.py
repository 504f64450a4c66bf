from __future__ import annotations

import pytest
from data_helpers import write_image

from library.config.dataset_schema import SubsetConfig
from library.data.folders import dreambooth_subsets, scan_subset
from library.errors import DataError


def test_dreambooth_subsets_parses_and_sorts(tmp_path):
    train, reg = tmp_path / "train", tmp_path / "reg"
    for name in ["10_sks dog", "2_cat_toy", "3", ".hidden"]:
        (train / name).mkdir(parents=True)
    (train / "notes.txt").write_text("not a folder")
    (reg / "1_dog").mkdir(parents=True)

    subsets = dreambooth_subsets(str(train), str(reg))

    assert subsets == [
        {"image_dir": str(train / "10_sks dog"), "class_tokens": "sks dog", "num_repeats": 10,
         "is_reg": False},
        {"image_dir": str(train / "2_cat_toy"), "class_tokens": "cat_toy", "num_repeats": 2,
         "is_reg": False},
        {"image_dir": str(train / "3"), "class_tokens": None, "num_repeats": 3, "is_reg": False},
        {"image_dir": str(reg / "1_dog"), "class_tokens": "dog", "num_repeats": 1, "is_reg": True},
    ]  # fmt: skip


def test_dreambooth_subsets_without_reg(tmp_path):
    (tmp_path / "5_a").mkdir()
    assert [s["num_repeats"] for s in dreambooth_subsets(str(tmp_path), None)] == [5]


@pytest.mark.parametrize("name", ["dog", "x_dog", "0_dog", "_5_dog"])
def test_folder_without_repeat_count_is_an_error(tmp_path, name):
    (tmp_path / name).mkdir()
    with pytest.raises(DataError, match=name):
        dreambooth_subsets(str(tmp_path), None)


def test_missing_and_empty_parent_folders_are_errors(tmp_path):
    with pytest.raises(DataError, match="missing.*does not exist"):
        dreambooth_subsets(str(tmp_path / "missing"), None)
    (tmp_path / "train" / "1_a").mkdir(parents=True)
    (tmp_path / "reg").mkdir()
    with pytest.raises(DataError, match="reg.*no subfolders"):
        dreambooth_subsets(str(tmp_path / "train"), str(tmp_path / "reg"))


def test_captions_from_sidecar_or_class_tokens(tmp_path):
    write_image(tmp_path / "b.png")
    write_image(tmp_path / "a.JPG")
    write_image(tmp_path / "c.webp")
    write_image(tmp_path / "._d.png")  # macOS resource fork: skipped
    (tmp_path / "e.psd").write_bytes(b"8BPS")  # not a training image type
    (tmp_path / "b.txt").write_text("\n  a photo of sks dog, grass  \nsecond line\n")
    (tmp_path / "c.txt").write_bytes("\ufeffcafé".encode())  # BOM skipped
    subset = SubsetConfig(image_dir=str(tmp_path), class_tokens="sks dog")

    items = scan_subset(subset)

    assert [i.path.name for i in items] == ["a.JPG", "b.png", "c.webp"]
    assert [i.caption for i in items] == ["sks dog", "a photo of sks dog, grass", "café"]
    assert all(i.subset_dir == str(tmp_path) and not i.is_reg for i in items)
    wildcard = scan_subset(
        SubsetConfig(image_dir=str(tmp_path), class_tokens="x", enable_wildcard=True)
    )
    assert wildcard[1].caption == "a photo of sks dog, grass\nsecond line"  # lines = alternatives


def test_caption_extension_is_used(tmp_path):
    write_image(tmp_path / "a.png")
    (tmp_path / "a.txt").write_text("wrong")
    (tmp_path / "a.caption").write_text("right")
    subset = SubsetConfig(image_dir=str(tmp_path), caption_extension=".caption", is_reg=True)
    [item] = scan_subset(subset)
    assert (item.caption, item.is_reg) == ("right", True)


def test_caption_errors_name_the_file(tmp_path):
    write_image(tmp_path / "a.png")
    (tmp_path / "a.txt").write_bytes(b"caf\xe9 latin-1")
    with pytest.raises(DataError, match=r"a\.txt.*UTF-8"):
        scan_subset(SubsetConfig(image_dir=str(tmp_path)))
    (tmp_path / "a.txt").write_text("  \n\n")
    with pytest.raises(DataError, match=r"a\.txt.*empty"):
        scan_subset(SubsetConfig(image_dir=str(tmp_path), class_tokens="dog"))
    (tmp_path / "a.txt").unlink()
    (tmp_path / "a.txt").mkdir()
    with pytest.raises(DataError, match=r"a\.txt \(for image a\.png\) is a folder"):
        scan_subset(SubsetConfig(image_dir=str(tmp_path)))


def test_empty_or_missing_image_dir_is_an_error(tmp_path):
    (tmp_path / "a.txt").write_text("caption without image")
    with pytest.raises(DataError, match="no images"):
        scan_subset(SubsetConfig(image_dir=str(tmp_path), class_tokens="x"))
    with pytest.raises(DataError, match="nope.*does not exist"):
        scan_subset(SubsetConfig(image_dir=str(tmp_path / "nope"), class_tokens="x"))
