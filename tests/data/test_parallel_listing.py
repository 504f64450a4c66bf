"""A large folder's listing sorted in parts (worker processes) gives exactly what the serial
listing gives: the same items, captions, ignored entries, stats and errors."""

from __future__ import annotations

import os
import sys

import pytest
from data_helpers import started_processes, write_image

from library.config.dataset_schema import DatasetConfig, SubsetConfig
from library.data import listing
from library.data.dataset import TrainData
from library.data.folders import scan_folder
from library.data.scan_index import ScanIndex
from library.errors import DataError


def _mixed_folder(folder):
    """Images with and without captions, every kind of entry the listing sorts."""
    for i in range(12):
        write_image(folder / f"{i:03d}.png")
        if i % 3:
            (folder / f"{i:03d}.txt").write_text(f"caption {i}\n", "utf-8")
    (folder / "003.npz").write_bytes(b"x")  # a sidecar: quiet
    (folder / ".hidden.png").write_bytes(b"x")  # hidden: quiet
    (folder / "Thumbs.db").write_bytes(b"x")  # a system file: quiet
    (folder / "notes.md").write_text("x")  # reported as ignored
    (folder / "folder.json").mkdir()  # a folder with a sidecar's name: reported
    (folder / "gone.png").symlink_to(folder / "nowhere.png")  # a broken link: an image, no stat
    (folder / "upper.TXT").write_text("x")  # another case of the caption extension: quiet


def _scan(folder, index_dir=None, **subset):
    subset = SubsetConfig(image_dir=str(folder), class_tokens="x", **subset)
    index = None if index_dir is None else ScanIndex(index_dir / "index.json")
    scan = scan_folder(subset, index)
    if index is not None:
        index.save()
    return scan


@pytest.fixture
def started(monkeypatch):
    """Lists each worker process started; the threshold lowered to the test folders' sizes."""
    workers = started_processes(monkeypatch)
    monkeypatch.setattr(listing, "_workers", lambda count: 3 if count >= 4 else 1)
    return workers


def _serial(monkeypatch):
    monkeypatch.setattr(listing, "_workers", lambda count: 1)


@pytest.mark.subprocess
def test_parts_give_the_serial_scan(tmp_path, monkeypatch, started):
    folder = tmp_path / "1_x"
    _mixed_folder(folder)
    parallel = _scan(folder)
    assert len(started) == 2  # two workers and this process
    with monkeypatch.context() as serial:
        _serial(serial)
        expected = _scan(folder)
    assert len(started) == 2
    assert parallel == expected
    assert [item.location for item in parallel.items][:3] == ["000.png", "001.png", "002.png"]
    assert {p.name for p in parallel.ignored} == {"notes.md", "folder.json"}


def _data(folder, cache):
    config = DatasetConfig(
        resolution=64, subsets=[SubsetConfig(image_dir=str(folder), class_tokens="x")]
    )
    return TrainData([config], seed=0, cache_dir=cache, skip_bad_images=True)


@pytest.mark.subprocess
def test_parts_give_the_serial_index_answers(tmp_path, monkeypatch, started):
    folder = tmp_path / "1_x"
    _mixed_folder(folder)
    with monkeypatch.context() as serial:
        _serial(serial)
        first = _data(folder, tmp_path / "cache")  # writes the index
    assert not started
    rerun = _data(folder, tmp_path / "cache")
    assert started
    assert rerun.scanned[0].images == first.scanned[0].images
    assert rerun.scanned[0].indexed == 12  # every good image answered by the index
    (folder / "004.txt").write_text("changed\n", "utf-8")  # rescanned, never trusted stale
    changed = _data(folder, tmp_path / "cache")
    captions = {image.item.location: image.item.caption for image in changed.scanned[0].images}
    assert captions["004.png"] == "changed"
    assert captions["005.png"] == "caption 5"


@pytest.mark.subprocess
@pytest.mark.parametrize("make", ["folder", "link"])
def test_parts_raise_the_serial_error(tmp_path, monkeypatch, started, make):
    folder = tmp_path / "1_x"
    _mixed_folder(folder)
    caption = folder / "000.txt"  # 000.png's caption path: not a regular file
    caption.mkdir() if make == "folder" else caption.symlink_to(tmp_path / "missing.txt")
    with pytest.raises(DataError) as parallel:
        _scan(folder)
    assert started
    with monkeypatch.context() as serial:
        _serial(serial)
        with pytest.raises(DataError) as expected:
            _scan(folder)
    assert str(parallel.value) == str(expected.value)
    assert "000.txt" in str(parallel.value)


@pytest.mark.subprocess
def test_a_failing_worker_costs_time_not_results(tmp_path, monkeypatch, started):
    folder = tmp_path / "1_x"
    _mixed_folder(folder)
    expected = _scan(folder)
    monkeypatch.setattr(listing.sys, "executable", os.devnull)  # it cannot start
    assert _scan(folder) == expected
    monkeypatch.setattr(listing.sys, "executable", "/bin/false")  # it exits with an error
    assert _scan(folder) == expected


def test_small_folders_start_no_process(monkeypatch):
    assert listing._workers(listing.PARALLEL_ENTRIES - 1) == 1
    monkeypatch.setattr(listing.os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    assert listing._workers(listing.PARALLEL_ENTRIES) == 2


@pytest.mark.subprocess
def test_a_worker_is_started_without_waiting_for_it_to_read(tmp_path):
    # its payload (larger than a pipe holds) is written while this process reads its own part:
    # the worker reads it only once it sees the flag, made after start_worker returned
    flag = tmp_path / "flag"
    code = (
        "import marshal, os, sys, time\n"
        "deadline = time.monotonic() + 20\n"
        f"while not os.path.exists({str(flag)!r}) and time.monotonic() < deadline:\n"
        "    time.sleep(0.01)\n"
        f"seen = os.path.exists({str(flag)!r})\n"
        "sys.stdout.buffer.write(marshal.dumps((seen, marshal.loads(sys.stdin.buffer.read()))))\n"
    )
    payload = [f"{i:0100d}" for i in range(10_000)]  # about 1 MB (distinct: marshal writes each)
    worker = listing.start_worker([sys.executable, "-c", code], payload)
    flag.touch()
    assert listing.finish_worker(worker) == (True, payload)


@pytest.mark.subprocess
def test_a_worker_dying_before_it_reads_its_part_is_a_failed_worker():
    worker = listing.start_worker(
        [sys.executable, "-c", "import sys; sys.exit(0)"], ["x"] * 100_000
    )
    assert listing.finish_worker(worker) is None
