"""The scan index: a rerun over an unchanged dataset reads no image header and no caption file;
a changed, added, removed or replaced image and an edited caption are read again; a damaged
index is rebuilt with one warning; every check of the scan still fires with an index."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest
from data_helpers import bucketed_config, count_paths, write_image

import library.data.folders as folders
import library.data.header_scan as header_scan
from library.config.dataset_schema import DatasetConfig, SubsetConfig
from library.data.dataset import TrainData
from library.data.items import CACHE_FOLDER, scan_index_path
from library.data.scan_index import ScanIndex
from library.errors import DataError

SIZES = [(16, 16), (24, 16), (16, 32), (40, 24)]


class Reads:
    """Counts the image headers and caption files the scan reads (the files themselves)."""

    def __init__(self, monkeypatch) -> None:
        self.images: list[str] = []
        self.captions: list[str] = []
        read_header, read_caption = header_scan.read_image_header, folders.caption_lines

        def header(path, mode=None):
            self.images.append(Path(path).name)
            return read_header(path, mode)

        def caption(path):
            self.captions.append(Path(path).name)
            return read_caption(path)

        monkeypatch.setattr(header_scan, "read_image_header", header)
        monkeypatch.setattr(folders, "caption_lines", caption)

    def clear(self) -> None:
        self.images.clear()
        self.captions.clear()


@pytest.fixture
def reads(monkeypatch):
    return Reads(monkeypatch)


def _folder(tmp_path: Path) -> Path:
    folder = tmp_path / "images"
    for i, size in enumerate(SIZES):
        write_image(folder / f"{i}.png", (10 * i, 0, 0), size)
        (folder / f"{i}.txt").write_text(f"caption {i}")
    return folder


def _config(folder: Path, **keys) -> DatasetConfig:
    return bucketed_config(folder, **keys)


def _scan(folder: Path, cache: Path, **keys):
    data = TrainData([_config(folder, **keys)], seed=0, cache_dir=str(cache))
    return data.scanned[0]


def _seen(scanned) -> dict[str, tuple]:
    """name -> (size, caption) as the scan found them."""
    return {i.item.path.name: (i.size, i.item.caption) for i in scanned.images}


def _truth(folder: Path) -> dict[str, tuple]:
    """name -> (size, caption) read directly from the files, independently of the scan."""
    from PIL import Image

    truth = {}
    for image in sorted(p for p in folder.iterdir() if p.suffix in (".png", ".bmp")):
        with Image.open(image) as opened:
            size = opened.size
        truth[image.name] = (size, image.with_suffix(".txt").read_text().strip())
    return truth


def test_a_rerun_reads_no_header_and_no_caption_and_finds_the_same(tmp_path, reads):
    folder, cache = _folder(tmp_path), tmp_path / "cache"
    first = _scan(folder, cache)
    assert sorted(reads.images) == [f"{i}.png" for i in range(len(SIZES))]
    assert _seen(first) == _truth(folder) and first.indexed == 0
    reads.clear()
    again = _scan(folder, cache)
    assert reads.images == [] and reads.captions == []
    assert _seen(again) == _truth(folder)
    assert again.indexed == len(SIZES)
    assert [i.bucket for i in again.images] == [i.bucket for i in first.images]


def test_each_image_is_opened_once(tmp_path, monkeypatch):
    from PIL import Image

    import library.data.images as images

    opened = []
    real = Image.open

    def counting(path, *args, **kwargs):
        opened.append(Path(path).name)
        return real(path, *args, **kwargs)

    monkeypatch.setattr(images.Image, "open", counting)
    TrainData([_config(_folder(tmp_path))], seed=0)
    assert sorted(opened) == [f"{i}.png" for i in range(len(SIZES))]


def test_a_folder_scan_resolves_no_path_per_image(tmp_path, monkeypatch):
    folder = _folder(tmp_path)
    resolved = []
    real = Path.resolve

    def counting(self, *args, **kwargs):
        resolved.append(self)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(Path, "resolve", counting)
    data = TrainData([_config(folder, cache_directory=str(tmp_path / "c"))], seed=0)
    assert len(data.scanned[0].images) == len(SIZES)
    assert [p for p in resolved if p.suffix == ".png"] == []
    assert [i.key for i in data.scanned[0].images] == [f"0/{i}.png" for i in range(len(SIZES))]


def _replace_keeping_times(path: Path, write) -> None:
    """Write other content to ``path``, then set its access and modification times back."""
    before = path.stat()
    write()
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))


@pytest.mark.parametrize(
    "change",
    ["other size", "same size, new mtime", "same size, old mtime", "replaced by rename"],
)
def test_a_changed_image_is_read_again(tmp_path, reads, change):
    folder, cache = _folder(tmp_path), tmp_path / "cache"
    # BMP is uncompressed: a 16x24 and a 24x16 picture are files of the same length
    target = write_image(folder / "5.bmp", (1, 2, 3), (16, 24))
    (folder / "5.txt").write_text("caption 5")
    _scan(folder, cache)
    length = target.stat().st_size
    if change == "other size":
        write_image(target, (0, 99, 0), (48, 16))
    elif change == "same size, new mtime":
        write_image(target, (0, 99, 0), (24, 16))
        os.utime(target, ns=(0, target.stat().st_mtime_ns + 10**9))
    elif change == "same size, old mtime":  # cp -p, a restored backup: only ctime tells
        _replace_keeping_times(target, lambda: write_image(target, (0, 99, 0), (24, 16)))
    else:  # a new file moved over the old name (a new inode), its times set to the old ones
        fresh = write_image(tmp_path / "new.bmp", (0, 99, 0), (24, 16))
        os.utime(fresh, ns=(target.stat().st_atime_ns, target.stat().st_mtime_ns))
        os.replace(fresh, target)
    if change != "other size":
        assert target.stat().st_size == length
    reads.clear()
    again = _scan(folder, cache)
    assert reads.images == ["5.bmp"]
    assert _seen(again) == _truth(folder)
    assert again.indexed == len(SIZES)


def test_an_added_and_a_removed_image_are_seen(tmp_path, reads):
    folder, cache = _folder(tmp_path), tmp_path / "cache"
    _scan(folder, cache)
    (folder / "0.png").unlink()
    (folder / "0.txt").unlink()
    write_image(folder / "9.png", (1, 2, 3), (64, 16))
    (folder / "9.txt").write_text("caption 9")
    reads.clear()
    again = _scan(folder, cache)
    assert reads.images == ["9.png"] and reads.captions == ["9.txt"]
    assert _seen(again) == _truth(folder)
    index = ScanIndex(scan_index_path(_config(folder).subsets[0], str(cache), False))
    assert set(index._images.table.rows) == {"1.png", "2.png", "3.png", "9.png"}  # 0.png dropped out


@pytest.mark.parametrize("keep_times", [False, True], ids=["new mtime", "old mtime"])
def test_an_edited_caption_is_read_again(tmp_path, reads, keep_times):
    folder, cache = _folder(tmp_path), tmp_path / "cache"
    _scan(folder, cache)
    caption = folder / "2.txt"
    if keep_times:  # same length, same mtime: only ctime (and the bytes) differ
        _replace_keeping_times(caption, lambda: caption.write_text("CAPTION 2"))
    else:
        caption.write_text("a longer, edited caption")
    reads.clear()
    again = _scan(folder, cache)
    assert reads.captions == ["2.txt"] and reads.images == []
    assert _seen(again) == _truth(folder)


def _index_file(folder: Path, cache: Path) -> Path:
    return scan_index_path(_config(folder).subsets[0], str(cache), False)


@pytest.mark.parametrize(
    "damage",
    ["truncated", "garbage", "empty", "other version", "body edited", "a folder"],
)
def test_a_damaged_index_is_rebuilt_with_one_warning(tmp_path, reads, caplog, damage):
    folder, cache = _folder(tmp_path), tmp_path / "cache"
    _scan(folder, cache)
    path = _index_file(folder, cache)
    data = path.read_bytes()
    if damage == "truncated":
        path.write_bytes(data[: len(data) // 2])
    elif damage == "garbage":
        path.write_bytes(os.urandom(len(data)))
    elif damage == "empty":
        path.write_bytes(b"")
    elif damage == "other version":
        path.write_bytes(data.replace(b'"version": ', b'"version": 999', 1))
    elif damage == "body edited":  # a size changed by hand: the checksum no longer fits
        path.write_bytes(data.replace(b"[16,16,1]", b"[99,99,1]", 1))
    else:
        path.unlink()
        path.mkdir()
    reads.clear()
    with caplog.at_level(logging.WARNING):
        again = _scan(folder, cache)
    warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1 and str(path) in warnings[0].getMessage()
    assert sorted(reads.images) == [f"{i}.png" for i in range(len(SIZES))]
    assert _seen(again) == _truth(folder) and again.indexed == 0
    if damage == "a folder":  # cannot be replaced by a file: no index, the scan still works
        return
    caplog.clear()
    reads.clear()
    third = _scan(folder, cache)
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert reads.images == [] and third.indexed == len(SIZES)


def test_no_index_without_a_cache_folder_and_beside_the_images_when_kept(tmp_path):
    folder = _folder(tmp_path)
    TrainData([_config(folder)], seed=0)
    assert not (folder / CACHE_FOLDER).exists()  # nothing written beside the images
    data = TrainData([_config(folder)], seed=0, keep_scan_index=True)
    assert data.scanned[0].indexed == 0
    assert len(list((folder / CACHE_FOLDER / "scan").glob("*.json"))) == 1
    assert TrainData([_config(folder)], seed=0, keep_scan_index=True).scanned[0].indexed == 4


def test_a_subset_cache_directory_holds_its_index(tmp_path):
    folder = _folder(tmp_path)
    TrainData([_config(folder, cache_directory=str(tmp_path / "mine"))], seed=0)
    assert len(list((tmp_path / "mine" / "scan").glob("*.json"))) == 1


def test_a_killed_write_of_the_index_is_cleared_when_it_is_written_again(tmp_path):
    folder, cache = _folder(tmp_path), tmp_path / "cache"
    _scan(folder, cache)
    path = _index_file(folder, cache)
    left = path.with_name(f".{path.name}.x1y2z3.tmp")  # as atomic_write_file names them
    left.write_bytes(b"half an index")
    os.utime(left, (0, 0))  # long ago: no live run is writing it
    write_image(folder / "7.png", (7, 7, 7), (16, 16))  # a change: the index is written again
    _scan(folder, cache)
    assert not left.exists() and path.exists()


def test_an_unreadable_index_folder_is_no_error(tmp_path):
    folder, cache = _folder(tmp_path), tmp_path / "cache"
    cache.write_text("a file where the cache folder would be")
    scanned = _scan(folder, cache)  # the index cannot be written: the scan is still whole
    assert _seen(scanned) == _truth(folder)


def _break(folder: Path, kind: str) -> str:
    """Make one file of ``folder`` bad in the way ``kind`` says; the text its error names."""
    if kind == "damaged image":
        data = bytearray((folder / "1.png").read_bytes())
        data[data.index(b"IDAT") + 6] ^= 0xFF
        (folder / "1.png").write_bytes(bytes(data))
        return "1.png cannot be read"
    if kind == "truncated image":
        data = (folder / "1.png").read_bytes()
        (folder / "1.png").write_bytes(data[: len(data) // 2])
        return "1.png cannot be read"
    if kind == "folder image":
        (folder / "x.png").mkdir()
        return "is a folder"
    if kind == "broken link":
        (folder / "y.png").symlink_to(folder / "missing.png")
        return "which does not exist"
    if kind == "fifo image":
        os.mkfifo(folder / "z.png")
        return "not a regular file"
    if kind == "empty caption":
        (folder / "2.txt").write_text("")
        return "2.txt is empty"
    if kind == "caption folder":
        (folder / "2.txt").unlink()
        (folder / "2.txt").mkdir()
        return "is a folder"
    if kind == "caption not UTF-8":
        (folder / "2.txt").write_bytes(b"\xff\xfe\xfa")
        return "is not UTF-8"
    raise AssertionError(kind)


KINDS = [
    "damaged image",
    "truncated image",
    "folder image",
    "broken link",
    "fifo image",
    "empty caption",
    "caption folder",
    "caption not UTF-8",
]


@pytest.mark.parametrize("kind", KINDS)
def test_every_check_fires_with_an_index_on_every_run(tmp_path, kind):
    if kind == "fifo image" and not hasattr(os, "mkfifo"):
        pytest.skip("needs os.mkfifo")
    folder, cache = _folder(tmp_path), tmp_path / "cache"
    _scan(folder, cache)  # an index of the good files
    named = _break(folder, kind)
    for _ in range(2):  # the bad file is never indexed: the second run finds it too
        with pytest.raises(DataError, match=named):
            _scan(folder, cache)


def test_an_unreadable_image_left_out_is_found_again(tmp_path):
    folder, cache = _folder(tmp_path), tmp_path / "cache"
    _break(folder, "damaged image")
    for _ in range(2):
        data = TrainData([_config(folder)], seed=0, skip_bad_images=True, cache_dir=str(cache))
        scanned = data.scanned[0]
        assert len(scanned.skipped) == 1 and "1.png" in scanned.skipped[0]
        assert len(scanned.images) == len(SIZES) - 1


def test_a_metadata_scan_resolves_only_paths_of_one_file(tmp_path, monkeypatch):
    folder = _folder(tmp_path)
    os.link(folder / "0.png", folder / "linked.png")  # a hard link: another image, same bytes
    write_image(folder / "extra.png", (5, 5, 5), (16, 16))  # not listed
    rows = [f"{i}.png,caption {i}" for i in range(len(SIZES))] + ["linked.png,the link"]
    metadata = tmp_path / "meta.csv"
    metadata.write_text("file_name,text\n" + "\n".join(rows) + "\n")
    resolved = []
    real = Path.resolve

    def counting(self, *args, **kwargs):
        resolved.append(self.name)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(Path, "resolve", counting)
    subset = SubsetConfig(metadata_file=str(metadata), image_dir=str(folder))
    config = DatasetConfig(
        resolution=128, enable_bucket=True, min_bucket_reso=64, max_bucket_reso=256,
        bucket_reso_steps=64, subsets=[subset],
    )  # fmt: skip
    scanned = TrainData([config], seed=0).scanned[0]
    assert sorted(i.item.path.name for i in scanned.images) == sorted(
        [f"{i}.png" for i in range(len(SIZES))] + ["linked.png"]
    )
    assert [p.name for p in scanned.unlisted] == ["extra.png"]
    assert set(resolved) <= {"0.png", "linked.png", folder.name}


# What the scanned dataset may hold per image besides its caption text, in one process (a
# million images: under 1 GB). Measured: about 0.8 KB (path, records, key, schedule entry).
MAX_BYTES_PER_IMAGE = 1024


def test_the_scanned_dataset_holds_under_a_kilobyte_per_image(tmp_path):
    import io
    import tracemalloc

    from PIL import Image

    folder, count = tmp_path / "many", 2000
    folder.mkdir()
    png = io.BytesIO()
    Image.new("RGB", (8, 8)).save(png, "PNG")
    for i in range(count):
        (folder / f"{i:06d}.png").write_bytes(png.getvalue())
        (folder / f"{i:06d}.txt").write_text("a dog")
    # a first scan fills Python's free lists (up to 2000 small tuples of each length, never
    # given back), which the traced scan would otherwise count as held
    TrainData([_config(folder)], seed=0)
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        data = TrainData([_config(folder)], seed=0)
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert len(data.scanned[0].images) == count
    assert held / count < MAX_BYTES_PER_IMAGE, held / count


def test_the_index_is_found_from_another_working_folder(tmp_path, monkeypatch, reads):
    folder, cache = _folder(tmp_path), tmp_path / "cache"
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    _scan(folder, cache)
    monkeypatch.chdir(elsewhere)  # the same absolute folder and cache, started from elsewhere
    reads.clear()
    again = _scan(folder, cache)
    assert reads.images == [] and again.indexed == len(SIZES)
    assert len(list((cache / "scan").glob("*.json"))) == 1


def test_a_rerun_makes_no_path_per_image(tmp_path, monkeypatch):
    folder, count = tmp_path / "many", 60
    for i in range(count):
        write_image(folder / f"{i:03d}.png", (i, 0, 0), (16, 16))
        (folder / f"{i:03d}.txt").write_text(f"caption {i}")
    TrainData([_config(folder)], seed=0, cache_dir=str(tmp_path / "cache"))  # opens each image
    made = count_paths(monkeypatch)
    data = TrainData([_config(folder)], seed=0, cache_dir=str(tmp_path / "cache"))
    assert len(made) < count // 4, len(made)
    assert data.scanned[0].indexed == count
    assert {i.item.path for i in data.scanned[0].images} == set(folder.glob("*.png"))


def test_a_first_scan_makes_no_path_per_image(tmp_path, monkeypatch):
    folder, count = tmp_path / "many", 60
    for i in range(count):
        write_image(folder / f"{i:03d}.png", (i, 0, 0), (16, 16))
        (folder / f"{i:03d}.txt").write_text(f"caption {i}")
    made = count_paths(monkeypatch)
    data = TrainData([_config(folder)], seed=0, cache_dir=str(tmp_path / "cache"))
    assert len(made) < count // 4, len(made)
    assert data.scanned[0].indexed == 0
    assert {i.item.path for i in data.scanned[0].images} == set(folder.glob("*.png"))


@pytest.mark.parametrize(
    "ns",
    [-(10**17), 2**63 - 1, 2**63],  # before 1970; the last ns a signed 64-bit number holds; beyond
    ids=["1966", "2262", "past 2262"],
)
def test_file_times_outside_the_usual_range_are_indexed_and_compared(tmp_path, reads, ns):
    folder, cache = _folder(tmp_path), tmp_path / "cache"
    target = folder / "1.png"
    try:
        os.utime(target, ns=(ns, ns))
        set_to = target.stat().st_mtime_ns
    except (OSError, OverflowError, ValueError):
        pytest.skip("the file system does not take this time")
    _scan(folder, cache)
    reads.clear()
    assert _scan(folder, cache).indexed == len(SIZES) and reads.images == []
    os.utime(target, ns=(set_to + 10**9, set_to + 10**9))
    reads.clear()
    again = _scan(folder, cache)
    assert reads.images == ["1.png"] and _seen(again) == _truth(folder)
