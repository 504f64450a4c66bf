"""Scanning image folders: nothing is dropped silently.

Every entry of a subset folder is either trained, an expected companion (captions, sidecars,
system and hidden files), listed in the plan as ignored, or an error naming it.
"""

from __future__ import annotations

import json
import os

import pytest
from data_helpers import index_color, write_image
from PIL import Image, features

from library.config.dataset_schema import DatasetConfig, SubsetConfig
from library.data.dataset import TrainData
from library.data.folders import IMAGE_EXTENSIONS, _Listing, is_quiet, scan_folder
from library.data.plan import plan_lines
from library.errors import DataError


def _data(folder, skip_bad_images=False, **subset):
    subset.setdefault("class_tokens", "x")
    config = DatasetConfig(resolution=64, subsets=[SubsetConfig(image_dir=str(folder), **subset)])
    return TrainData([config], seed=0, skip_bad_images=skip_bad_images)


def _one_line(error: pytest.ExceptionInfo) -> str:
    message = str(error.value)
    assert "\n" not in message
    return message


def test_the_training_image_extensions():
    # Written out here rather than taken from the module, so a change to the list shows.
    expected = {".png", ".apng", ".jpg", ".jpeg", ".jpe", ".jfif", ".webp", ".bmp", ".gif"}
    expected |= {".tif", ".tiff"} | ({".avif"} if features.check("avif") else set())
    assert expected == IMAGE_EXTENSIONS


def test_every_training_image_extension_is_scanned_and_decoded(tmp_path):
    folder = tmp_path / "1_all"
    formats = {".apng": "PNG", ".jpe": "JPEG", ".jfif": "JPEG", ".tif": "TIFF"}
    names = []
    for i, extension in enumerate(sorted(IMAGE_EXTENSIONS)):
        name = f"{i}{extension.upper() if i % 2 else extension}"  # any case is an image
        folder.mkdir(exist_ok=True)
        Image.new("RGB", (16, 16), index_color(i)).save(folder / name, formats.get(extension))
        names.append(name)
    data = _data(folder)
    assert sorted(image.item.path.name for image in data.scanned[0].images) == sorted(names)
    assert not data.stats.datasets[0].ignored_files


def test_unknown_entries_are_listed_and_companions_are_not(tmp_path):
    folder = tmp_path / "2_dog"
    write_image(folder / "a.png")
    write_image(folder / "b.gif")
    write_image(folder / "c.tiff")
    (folder / "a.txt").write_text("a caption")
    for companion in ["a.npz", "a_te_outputs.npz", "meta.json", "m.jsonl", "m.csv", "d.caption",
                      "Thumbs.db", "desktop.ini", ".DS_Store", "._a.png", "orphan.txt"]:  # fmt: skip
        (folder / companion).write_bytes(b"x")
    (folder / ".difftune_cache").mkdir()
    for unknown in ["notes.md", "x.psd", "y.heic", "z.jxl"]:
        (folder / unknown).write_bytes(b"x")
    (folder / "sub").mkdir()
    (folder / "e.txt").mkdir()  # a folder is not a caption file, even with the extension

    scan = scan_folder(SubsetConfig(image_dir=str(folder), class_tokens="dog"))

    assert [item.path.name for item in scan.items] == ["a.png", "b.gif", "c.tiff"]
    assert [item.caption for item in scan.items] == ["a caption", "dog", "dog"]
    assert [path.name for path in scan.ignored] == [
        "e.txt", "notes.md", "sub", "x.psd", "y.heic", "z.jxl"
    ]  # fmt: skip
    lines = plan_lines(_data(folder))
    assert (
        "  6 files that are not training images were ignored: 2_dog/e.txt/, 2_dog/notes.md, "
        "2_dog/sub/, 2_dog/x.psd, 2_dog/y.heic, ..."
    ) in lines


@pytest.mark.parametrize("caption_extension", [".txt", ".caption", ".TXT", ".md"])
def test_the_listing_reports_what_is_quiet_would(tmp_path, caption_extension):
    """The listing sorts a million names in one pass with its own shortcuts; what it reports
    as ignored is what is_quiet says of each non-image entry."""
    names = ["a.txt", "b.caption", "c.TXT", "d.md", ".e.txt", "thumbs.db", "f.json", "g", ".h"]
    for name in names:
        (tmp_path / name).write_bytes(b"x")
        (tmp_path / f"dir{name}").mkdir()  # a folder under a caption's or sidecar's name
        (tmp_path / f".dir{name}").mkdir()  # a hidden folder
    write_image(tmp_path / "z.png")
    with os.scandir(tmp_path) as entries:
        expected = sorted(
            entry.name
            for entry in entries
            if entry.name != "z.png" and not is_quiet(entry, caption_extension)
        )
    listing = _Listing(tmp_path, caption_extension)
    assert listing.images == ["z.png"]
    assert sorted(path.name for path in listing.ignored) == expected
    assert "dira.txt" in expected  # a folder is never a caption file


def test_a_clean_folder_reports_nothing_ignored(tmp_path):
    write_image(tmp_path / "a.png")
    (tmp_path / "a.txt").write_text("cap")
    assert not any("ignored" in line for line in plan_lines(_data(tmp_path)))


def test_a_folder_of_only_unsupported_files_names_them(tmp_path):
    for name in ["a.heic", "b.heic", "c.psd", "d.psd"]:
        (tmp_path / name).write_bytes(b"x")
    with pytest.raises(DataError, match=r"has no images \(.*\), only a\.heic, b\.heic, c\.psd, "):
        scan_folder(SubsetConfig(image_dir=str(tmp_path), class_tokens="x"))


def test_a_broken_link_to_an_image_is_an_error_or_skipped_and_counted(tmp_path):
    write_image(tmp_path / "a.png")
    os.symlink(tmp_path / "gone.png", tmp_path / "b.png")
    with pytest.raises(DataError) as error:
        _data(tmp_path)
    assert _one_line(error) == (
        f"image {tmp_path / 'b.png'} is a link to {tmp_path / 'gone.png'}, which does not exist; "
        "fix or remove the link (or set skip_bad_images = true)"
    )
    data = _data(tmp_path, skip_bad_images=True)
    assert [image.item.path.name for image in data.scanned[0].images] == ["a.png"]
    assert len(data.skipped_images) == 1 and "b.png is a link" in data.skipped_images[0]
    assert "  1 unreadable images left out (skip_bad_images)" in plan_lines(data)


def test_a_link_to_a_folder_with_an_image_name_is_an_error(tmp_path):
    write_image(tmp_path / "a.png")
    (tmp_path / "real").mkdir()
    os.symlink(tmp_path / "real", tmp_path / "b.png")
    with pytest.raises(DataError, match=r"b\.png is a folder, not an image file; rename or remove"):
        _data(tmp_path)


def test_a_link_to_an_image_elsewhere_is_trained(tmp_path):
    write_image(tmp_path / "elsewhere" / "real.png", (10, 20, 30))
    (tmp_path / "1_x").mkdir()
    os.symlink(tmp_path / "elsewhere" / "real.png", tmp_path / "1_x" / "a.png")
    data = _data(tmp_path / "1_x")
    assert [image.item.path.name for image in data.scanned[0].images] == ["a.png"]


@pytest.mark.parametrize(
    ("make", "problem"),
    [
        (lambda path: path.mkdir(), "is a folder, not a caption file; rename or remove it"),
        (
            lambda path: os.symlink(path.parent / "gone.txt", path),
            "is a link to {parent}/gone.txt, which does not exist; fix or remove the link",
        ),
        (
            lambda path: os.mkfifo(path),
            "is not a regular file; replace it with a text file or remove it",
        ),
    ],
    ids=["folder", "broken-link", "fifo"],
)
def test_a_caption_path_that_is_not_a_file_is_an_error(tmp_path, make, problem):
    write_image(tmp_path / "a.png")
    make(tmp_path / "a.txt")
    with pytest.raises(DataError) as error:
        _data(tmp_path)
    expected = f"caption file {tmp_path / 'a.txt'} (for image a.png) " + problem.format(
        parent=tmp_path
    )
    assert _one_line(error) == expected


# --- metadata subsets: images the file does not list ------------------------------------------


def test_images_a_metadata_file_does_not_list_are_reported(tmp_path):
    folder = tmp_path / "set"
    for name in ["a.png", "b.png", "c.png", "d.webp"]:
        write_image(folder / name)
    (folder / "notes.md").write_text("not an image: not reported for metadata subsets")
    lines = [json.dumps({"file_name": name, "text": "cap"}) for name in ["a.png", "c.png"]]
    (folder / "metadata.jsonl").write_text("\n".join(lines))
    subset = SubsetConfig(metadata_file=str(folder / "metadata.jsonl"))
    data = TrainData([DatasetConfig(resolution=64, subsets=[subset])], seed=0)
    assert data.num_train_images == 2
    assert (
        "  2 images are not listed in their metadata file and were ignored: set/b.png, set/d.webp"
    ) in plan_lines(data)


def test_a_broken_link_in_a_metadata_file_is_skipped_with_skip_bad_images(tmp_path):
    write_image(tmp_path / "a.png")
    os.symlink(tmp_path / "gone.png", tmp_path / "b.png")
    (tmp_path / "meta.json").write_text(json.dumps({"a": {"caption": "x"}, "b": {"caption": "y"}}))
    subset = SubsetConfig(metadata_file=str(tmp_path / "meta.json"))
    config = DatasetConfig(resolution=64, subsets=[subset])
    with pytest.raises(DataError, match=r"b\.png is a link to .*gone\.png, which does not exist"):
        TrainData([config], seed=0)
    data = TrainData([config], seed=0, skip_bad_images=True)
    assert data.num_train_images == 1 and len(data.skipped_images) == 1
