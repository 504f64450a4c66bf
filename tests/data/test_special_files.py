"""Files that are not regular files (a FIFO, a device) among the training images and their
references are named before the plan, not opened: opening a FIFO waits for a writer forever."""

from __future__ import annotations

import json
import os
import threading

import pytest
from data_helpers import write_image

from library.config.dataset_schema import DatasetConfig, SubsetConfig
from library.data.dataset import TrainData
from library.errors import DataError

pytestmark = pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs os.mkfifo")

TIMEOUT_S = 20


def _scan_within_timeout(config: DatasetConfig, fifo) -> BaseException | None:
    """Scan ``config`` in a thread; the error it raised (None if none). A scan still running
    after TIMEOUT_S is a hang: the FIFO is opened for writing to release it, and the test fails."""
    outcome: list[BaseException | None] = []

    def scan():
        try:
            TrainData([config], seed=0)
            outcome.append(None)
        except BaseException as error:  # noqa: BLE001 - handed to the test
            outcome.append(error)

    thread = threading.Thread(target=scan, daemon=True)
    thread.start()
    thread.join(TIMEOUT_S)
    if thread.is_alive():
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))  # a writer that leaves: EOF
        thread.join(TIMEOUT_S)
        pytest.fail(f"scanning a dataset with the FIFO {fifo} hung")
    return outcome[0]


def _folder(tmp_path):
    image_dir = tmp_path / "img"
    write_image(image_dir / "a.png", size=(64, 64))
    (image_dir / "a.txt").write_text("a")
    return image_dir


def test_a_fifo_among_the_images_is_named_not_opened(tmp_path):
    image_dir = _folder(tmp_path)
    fifo = image_dir / "b.png"
    os.mkfifo(fifo)
    config = DatasetConfig(resolution=64, subsets=[SubsetConfig(image_dir=str(image_dir))])
    error = _scan_within_timeout(config, fifo)
    assert isinstance(error, DataError)
    assert "b.png is not a regular file" in str(error)


def test_a_fifo_as_a_reference_is_named_not_opened(tmp_path):
    image_dir = _folder(tmp_path)
    control_dir = tmp_path / "ctl"
    control_dir.mkdir()
    fifo = control_dir / "a.png"
    os.mkfifo(fifo)
    subset = SubsetConfig(image_dir=str(image_dir), control_directory=str(control_dir))
    error = _scan_within_timeout(DatasetConfig(resolution=64, subsets=[subset]), fifo)
    assert isinstance(error, DataError)
    assert "ctl/a.png is not a regular file" in str(error)


def test_a_fifo_a_jsonl_names_is_called_what_it_is(tmp_path):
    _folder(tmp_path)
    fifo = tmp_path / "ref.png"
    os.mkfifo(fifo)
    metadata = tmp_path / "pairs.jsonl"
    record = {"image_path": "img/a.png", "caption": "a", "control_path": "ref.png"}
    metadata.write_text(json.dumps(record))
    config = DatasetConfig(resolution=64, subsets=[SubsetConfig(metadata_file=str(metadata))])
    error = _scan_within_timeout(config, fifo)
    assert isinstance(error, DataError)
    assert "ref.png is not a regular file" in str(error)
