"""The scan index holds its names in name order, the order of a folder's listing, so a rerun over
an unchanged folder compares the two lists as they are, without looking a name up; an index in
another order (an older difftune's) is written again in name order, reading no file."""

from __future__ import annotations

import base64
import hashlib
import json
import logging
from pathlib import Path

import numpy as np
import pytest
from data_helpers import bucketed_config, write_image

import library.data.header_scan as header_scan
import library.data.scan_index as scan_index
from library.data.dataset import TrainData
from library.data.items import scan_index_path

NAMES = ["0", "1", "2", "3"]


def _folder(tmp_path: Path) -> Path:
    folder = tmp_path / "images"
    for i, name in enumerate(NAMES):
        write_image(folder / f"{name}.png", (10 * i, 0, 0), (16 + 8 * i, 16))
        (folder / f"{name}.txt").write_text(f"caption {name}")
    return folder


def _scan(folder: Path, cache: Path):
    data = TrainData([bucketed_config(folder)], seed=0, cache_dir=str(cache))
    return data.scanned[0]


def _index(folder: Path, cache: Path) -> Path:
    return scan_index_path(bucketed_config(folder).subsets[0], str(cache), False)


def _body(path: Path) -> dict:
    return json.loads(path.read_bytes().partition(b"\n")[2])


@pytest.fixture
def lookups(monkeypatch):
    """Counts the times a name -> row table of an index is asked for."""
    asked = []
    table = scan_index._Table.rows

    def counting(self):
        asked.append(len(self.names))
        return table.fget(self)

    monkeypatch.setattr(scan_index._Table, "rows", property(counting))
    return asked


def test_names_are_written_in_name_order_after_a_file_is_added(tmp_path):
    folder, cache = _folder(tmp_path), tmp_path / "cache"
    _scan(folder, cache)
    write_image(folder / "15.png", (1, 2, 3), (40, 16))  # between "1.png" and "2.png"
    (folder / "15.txt").write_text("caption 15")
    _scan(folder, cache)
    body = _body(_index(folder, cache))
    for kind, suffix in (("images", ".png"), ("captions", ".txt")):
        expected = sorted(p.name for p in folder.iterdir() if p.suffix == suffix)
        assert body[kind]["names"] == expected


def test_a_rerun_over_an_unchanged_folder_looks_up_no_name(tmp_path, lookups):
    folder, cache = _folder(tmp_path), tmp_path / "cache"
    first = _scan(folder, cache)
    again = _scan(folder, cache)
    assert again.images == first.images and again.indexed == len(NAMES)
    assert lookups == []
    (folder / "2.txt").write_text("an edited caption")  # same names: still no lookup
    edited = _scan(folder, cache)
    assert lookups == []
    assert {i.item.location: i.item.caption for i in edited.images}["2.png"] == "an edited caption"
    write_image(folder / "9.png", (1, 2, 3), (40, 16))  # other names: looked up
    _scan(folder, cache)
    assert lookups


def _reversed(path: Path) -> None:
    """The index file with every table's entries in reverse name order, checksum made anew."""
    body = _body(path)
    for part in body.values():
        part["names"].reverse()
        count = len(part["names"])
        identities = np.frombuffer(base64.b64decode(part["identities"]), "<i8").reshape(count, 4)
        part["identities"] = base64.b64encode(identities[::-1].tobytes()).decode()
        if isinstance(part["values"], list):
            part["values"].reverse()
        else:  # the images' numbers in the table of headers
            codes = np.frombuffer(base64.b64decode(part["values"]), "<i8")
            part["values"] = base64.b64encode(codes[::-1].tobytes()).decode()
    _write(path, body)


def _write(path: Path, body: dict) -> None:
    """An index file of ``body`` with a checksum that fits it."""
    data = json.dumps(body, separators=(",", ":")).encode()
    checksum = hashlib.blake2b(data, digest_size=16).hexdigest()
    header = {"format": scan_index.FORMAT, "version": scan_index.VERSION, "checksum": checksum}
    path.write_bytes(json.dumps(header).encode() + b"\n" + data)


def test_an_index_in_another_order_is_written_again_in_name_order(tmp_path, monkeypatch):
    folder, cache = _folder(tmp_path), tmp_path / "cache"
    first = _scan(folder, cache)
    path = _index(folder, cache)
    _reversed(path)
    assert _body(path)["images"]["names"] == [f"{n}.png" for n in reversed(NAMES)]
    opened = []
    read = header_scan.read_image_header
    monkeypatch.setattr(header_scan, "read_image_header", lambda *a: opened.append(a) or read(*a))
    again = _scan(folder, cache)
    assert opened == [] and again.images == first.images and again.indexed == len(NAMES)
    assert _body(path)["images"]["names"] == [f"{n}.png" for n in NAMES]
    assert _body(path)["captions"]["names"] == [f"{n}.txt" for n in NAMES]
    written = path.read_bytes()
    _scan(folder, cache)
    assert path.read_bytes() == written  # in name order: not written again


def test_an_index_whose_names_are_not_text_is_rebuilt_with_one_warning(tmp_path, caplog):
    folder, cache = _folder(tmp_path), tmp_path / "cache"
    first = _scan(folder, cache)
    path = _index(folder, cache)
    body = _body(path)
    body["images"]["names"] = list(range(len(NAMES)))  # checksum fits: only the names are wrong
    _write(path, body)
    with caplog.at_level(logging.WARNING):
        again = _scan(folder, cache)
    warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1 and "names are not all text" in warnings[0].getMessage()
    assert again.images == first.images and again.indexed == 0
    assert _body(path)["images"]["names"] == [f"{n}.png" for n in NAMES]
