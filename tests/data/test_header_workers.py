"""Many image headers and caption files read in parts (worker processes) give exactly what the
serial read gives: the same sizes, frames, captions, problems and errors, and the scan index
keeps what the workers read."""

from __future__ import annotations

import pytest
from data_helpers import started_processes, write_image
from PIL import Image

from library.config.dataset_schema import DatasetConfig, SubsetConfig
from library.data import header_workers
from library.data.dataset import TrainData
from library.errors import DataError


def _mixed_folder(folder):
    """Good images of several sizes, most with captions, an animated one and every kind of bad
    image entry."""
    for i in range(12):
        write_image(folder / f"{i:03d}.png", (i, 0, 0), (16 + 8 * (i % 3), 16))
        if i % 4:
            (folder / f"{i:03d}.txt").write_text(f"caption {i}\nsecond line {i}\n", "utf-8")
    frames = [Image.new("RGB", (24, 16), (c, 0, 0)) for c in (0, 90)]
    frames[0].save(folder / "anim.gif", save_all=True, append_images=frames[1:])
    (folder / "broken.png").write_bytes(b"\x89PNG\r\n\x1a\n not a png")
    (folder / "dir.png").mkdir()
    (folder / "gone.png").symlink_to(folder / "nowhere.png")


@pytest.fixture
def started(monkeypatch):
    """Lists each header worker started; the threshold lowered to the test folder's size."""
    workers = started_processes(monkeypatch)
    monkeypatch.setattr(header_workers, "parts", lambda count: 3 if count >= 4 else 1)
    return workers


def _data(folder, cache=None, skip=True):
    config = DatasetConfig(
        resolution=64, subsets=[SubsetConfig(image_dir=str(folder), class_tokens="x")]
    )
    return TrainData([config], seed=0, cache_dir=cache, skip_bad_images=skip).scanned[0]


def _found(scanned):
    """The images (their cache folder aside: a scan with an index has another) and problems."""
    return [image._replace(cache_root=None) for image in scanned.images], scanned.skipped


def _serial(monkeypatch):
    monkeypatch.setattr(header_workers, "parts", lambda count: 1)


@pytest.mark.subprocess
def test_parts_give_the_serial_scan_and_index(tmp_path, monkeypatch, started):
    folder = tmp_path / "1_x"
    _mixed_folder(folder)
    parallel = _data(folder, tmp_path / "cache")
    assert len(started) == 4  # two workers and this process, for the captions and the headers
    with monkeypatch.context() as serial:
        _serial(serial)
        expected = _data(folder)
    assert _found(parallel) == _found(expected)
    assert parallel.animated == expected.animated and [p.name for p in parallel.animated] == [
        "anim.gif"
    ]
    assert len(parallel.skipped) == 3  # broken, folder, broken link
    again = _data(folder, tmp_path / "cache")  # the workers' reads were indexed
    assert len(started) == 4 and again.indexed == 13 and again.images == parallel.images
    captions = {image.item.location: image.item.caption for image in again.images}
    assert captions["001.png"] == "caption 1" and captions["004.png"] == "x"


@pytest.mark.subprocess
@pytest.mark.parametrize("bad", ["image", "caption"])
def test_parts_raise_the_serial_error(tmp_path, monkeypatch, started, bad):
    folder = tmp_path / "1_x"
    _mixed_folder(folder)
    if bad == "caption":
        (folder / "006.txt").write_bytes(b"caf\xe9")  # not UTF-8
        (folder / "010.txt").write_text("")  # empty: the first in image order is raised
    with pytest.raises(DataError) as parallel:
        _data(folder, skip=False)
    assert started
    with monkeypatch.context() as serial:
        _serial(serial)
        with pytest.raises(DataError) as expected:
            _data(folder, skip=False)
    assert str(parallel.value) == str(expected.value)
    assert ("006.txt" if bad == "caption" else ".png") in str(parallel.value)


@pytest.mark.subprocess
def test_a_failed_worker_costs_time_not_results(tmp_path, monkeypatch, started):
    folder = tmp_path / "1_x"
    _mixed_folder(folder)
    monkeypatch.setattr(header_workers, "_REPOSITORY", str(tmp_path / "missing"))
    parallel = _data(folder)
    assert started  # they started and failed: their parts were read here
    with monkeypatch.context() as serial:
        _serial(serial)
        expected = _data(folder)
    assert (parallel.images, parallel.skipped) == (expected.images, expected.skipped)
