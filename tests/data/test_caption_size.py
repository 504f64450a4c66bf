"""A caption holds at most MAX_CAPTION_BYTES (1 MiB, hundreds of times a long tag list): a
larger caption file, or metadata entry, is refused naming the file (and the entry), and a caption
file is never read past the bound."""

from __future__ import annotations

import json
import tracemalloc

import pytest
from data_helpers import write_image

from library.config.dataset_schema import DatasetConfig, SubsetConfig
from library.data.dataset import TrainData
from library.data.folders import MAX_CAPTION_BYTES, read_caption_file
from library.data.metadata_files import read_metadata_entries
from library.errors import DataError


def test_the_bound_is_far_above_a_real_caption():
    tags = ", ".join(f"tag number {i}" for i in range(300))  # a very long tag list: ~4.5 KB
    assert 100 * len(tags.encode()) <= MAX_CAPTION_BYTES


def test_a_caption_at_the_bound_is_read_and_one_byte_more_is_refused(tmp_path):
    at = tmp_path / "at.txt"
    at.write_bytes(b"a" * MAX_CAPTION_BYTES)
    assert read_caption_file(at) == "a" * MAX_CAPTION_BYTES
    over = tmp_path / "over.txt"
    over.write_bytes(b"a" * (MAX_CAPTION_BYTES + 1))
    with pytest.raises(
        DataError,
        match=rf"caption file {over} holds 1 MiB \(1,048,577 bytes\), more than the 1 MiB",
    ):
        read_caption_file(over)


def test_a_huge_caption_file_stops_the_scan_without_being_read(tmp_path):
    folder = tmp_path / "1_dog"
    write_image(folder / "a.png", size=(64, 64))
    huge = folder / "a.txt"
    with open(huge, "wb") as file:  # 64 MiB, sparse: nothing to write, much to read
        file.truncate(64 << 20)
    subset = SubsetConfig(image_dir=str(folder))
    tracemalloc.start()
    try:
        with pytest.raises(DataError) as error:
            TrainData([DatasetConfig(resolution=64, subsets=[subset])], seed=0)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert f"caption file {huge} holds 64 MiB" in str(error.value)
    assert peak < 4 * MAX_CAPTION_BYTES  # the bound and a little, not the file


def test_a_short_caption_is_read_without_setting_aside_the_bound(tmp_path):
    caption = tmp_path / "a.txt"
    caption.write_text("a dog, on grass")
    tracemalloc.start()
    try:
        text = read_caption_file(caption)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert text == "a dog, on grass"
    # a read of the bound's size would set aside a megabyte per caption (most of its cost)
    assert peak < MAX_CAPTION_BYTES // 16


def test_a_file_whose_size_says_nothing_is_read_to_the_bound():
    import os

    from library.data.caption_files import _read_at_most

    read_end, write_end = os.pipe()  # a pipe's size is 0 whatever it holds
    os.write(write_end, b"x" * 5000)
    os.close(write_end)
    with open(read_end, "rb") as pipe:
        assert _read_at_most(pipe, 4001) == b"x" * 4001
    read_end, write_end = os.pipe()
    os.write(write_end, b"y" * 300)
    os.close(write_end)
    with open(read_end, "rb") as pipe:
        assert _read_at_most(pipe, 4001) == b"y" * 300


@pytest.mark.parametrize(
    "name, entry, where",
    [
        ("meta.json", lambda text: {"a": {"caption": "ok", "tags": text}}, 'entry "a": "tags"'),
        ("metadata.jsonl", lambda text: {"file_name": "a.png", "text": text}, 'line 1: "text"'),
    ],
)
def test_a_huge_caption_in_a_metadata_file_names_the_file_and_entry(tmp_path, name, entry, where):
    write_image(tmp_path / "a.png")
    path = tmp_path / name
    record = entry("é" * (MAX_CAPTION_BYTES // 2 + 1))  # 2 bytes each in UTF-8
    path.write_text(json.dumps(record, ensure_ascii=False), encoding="utf-8")
    with pytest.raises(
        DataError, match=rf"metadata file {path} {where} holds 1 MiB \(1,048,578 bytes\), more than"
    ):
        read_metadata_entries(str(path), None)
    shorter = entry("é" * (MAX_CAPTION_BYTES // 2))
    path.write_text(json.dumps(shorter, ensure_ascii=False), encoding="utf-8")
    assert len(read_metadata_entries(str(path), None)) == 1
