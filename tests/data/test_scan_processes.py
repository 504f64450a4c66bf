"""Two processes (spawned, gloo over a file store) scan a dataset once: rank 0 reads the files,
rank 1 receives what it found; a bad file stops both ranks with the same one-line error."""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path

import pytest
import torch.distributed as dist
import torch.multiprocessing as mp
from data_helpers import bucketed_config, write_image

import library.data.header_scan as header_scan
from library.config.dataset_schema import DatasetConfig
from library.data.cache_group import CacheGroup
from library.data.dataset import TrainData
from library.errors import DataError

WORLD = 2


def _config(folder: Path) -> DatasetConfig:
    return bucketed_config(folder)


def worker(rank: int, init_file: str, good: str, bad: str, out: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=WORLD)
    try:
        read = []
        real = header_scan.read_image_header

        def counting(path, mode=None):
            read.append(Path(path).name)
            return real(path, mode)

        header_scan.read_image_header = counting
        group = CacheGroup(timeout=timedelta(seconds=120))
        data = TrainData([_config(Path(good))], seed=0, world_size=WORLD, group=group)
        record = {
            "read": sorted(read),
            "images": [
                (i.key, list(i.size), list(i.bucket), i.item.caption)
                for i in data.scanned[0].images
            ],
            "scan_seconds": data.scan_seconds,
        }
        try:
            TrainData([_config(Path(bad))], seed=0, world_size=WORLD, group=group)
            record["error"] = None
        except DataError as error:
            record["error"] = str(error)
        (Path(out) / f"rank{rank}.json").write_text(json.dumps(record))
    finally:
        dist.destroy_process_group()


@pytest.mark.distributed
@pytest.mark.subprocess
def test_one_rank_scans_and_the_other_receives_the_same(tmp_path):
    good, bad, out = tmp_path / "good", tmp_path / "bad", tmp_path / "out"
    out.mkdir()
    for i, size in enumerate([(16, 16), (32, 16), (16, 48)]):
        write_image(good / f"{i}.png", (i, 0, 0), size)
        (good / f"{i}.txt").write_text(f"caption {i}")
        write_image(bad / f"{i}.png", (i, 0, 0), size)
    (bad / "1.png").write_bytes(b"not a picture")
    args = (str(tmp_path / "init"), str(good), str(bad), str(out))
    mp.spawn(worker, args=args, nprocs=WORLD, join=True)
    first, second = (json.loads((out / f"rank{r}.json").read_text()) for r in range(WORLD))
    assert first["read"] == ["0.png", "1.png", "2.png"] and second["read"] == []
    expected = TrainData([_config(good)], seed=0).scanned[0].images  # one process, independently
    assert first["images"] == second["images"]
    assert first["images"] == [
        [i.key, list(i.size), list(i.bucket), i.item.caption] for i in expected
    ]
    assert "1.png cannot be read" in first["error"]
    assert second["error"].startswith(first["error"])
    assert "(on rank 0, while scanning the datasets)" in second["error"]
