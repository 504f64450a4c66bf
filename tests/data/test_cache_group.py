"""The cache group and a latent cache built by two processes (spawned, gloo over a file store).

One spawn runs every two-process check (starting processes is the slow part); each rank writes
what it saw to a file and the test compares the ranks with each other and with direct encodes.
"""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from library.data.cache_group import CacheGroup, PeerFailed, gather_in_rounds, gather_or_raise
from library.data.latent_cache import LatentCache, LatentRequest, cache_file
from library.errors import DataError
from tests.data.test_latent_cache import (
    Counting,
    expected_mean,
    fake_encode,
    load_pixels,
    write_png,
)

WORLD = 2


def make_requests(data: Path) -> list[LatentRequest]:
    """Seven entries over two sizes, flips, and one repeated request."""
    paths = [data / f"{i}.png" for i in range(5)]
    requests = [LatentRequest(p, (24, 16), None, False, False, data) for p in paths]
    requests += [LatentRequest(p, (16, 16), None, True, False, data) for p in paths[:2]]
    return requests + requests[:1]


def _build_on_rank(cache: LatentCache, requests, group: CacheGroup, rank: int) -> dict:
    counting = Counting()
    stats = cache.build(requests, counting.encode, counting.load, 2, rank, WORLD, group)
    loaded = [name for name, count in counting.loaded.items() for _ in range(count)]
    return {"stats": [stats.encoded_here, stats.reused, stats.total], "loaded": loaded}


def _peer_error(group: CacheGroup, rank: int) -> str:
    error = DataError("image bad.png cannot be read") if rank == 1 else None
    try:
        gather_or_raise(group, rank, error, "testing")
    except DataError as raised:
        return str(raised)
    return "no error"


def _mismatch_error(requests, group: CacheGroup, rank: int) -> str:
    try:
        _build_on_rank(LatentCache("vae", torch.float32, False), requests, group, rank)
    except DataError as raised:
        return str(raised)
    return "no error"


def worker(rank: int, init_file: str, data: str, out: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=WORLD)
    try:
        group = CacheGroup(timeout=timedelta(seconds=120))
        requests = make_requests(Path(data))
        record = {
            "rank": [group.rank, group.world_size],
            "gathered": group.all_gather_object(f"from {rank}"),
            "rounds": gather_in_rounds(group, [rank] * (3 + rank), per_round=2),
            "disk": _build_on_rank(LatentCache("vae", torch.float32, True), requests, group, rank),
        }
        group.barrier()
        record["disk_again"] = _build_on_rank(
            LatentCache("vae", torch.float32, True), requests, group, rank
        )
        memory = LatentCache("vae", torch.float32, False)
        record["memory"] = _build_on_rank(memory, requests, group, rank)
        entries = {memory.key(r): (memory.get(r).mean, memory.get(r).std) for r in requests}
        torch.save(entries, Path(out) / f"memory{rank}.pt")
        record["peer_error"] = _peer_error(group, rank)
        one_less = [r for i, r in enumerate(requests) if (rank, i) != (1, 1)]
        record["mismatch"] = _mismatch_error(one_less, group, rank)
        (Path(out) / f"rank{rank}.json").write_text(json.dumps(record))
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory):
    root = tmp_path_factory.mktemp("two-ranks")
    data, out = root / "data", root / "out"
    out.mkdir()
    for i in range(5):
        write_png(data / f"{i}.png", seed=i)
    mp.spawn(worker, args=(str(root / "init"), str(data), str(out)), nprocs=WORLD, join=True)
    records = [json.loads((out / f"rank{r}.json").read_text()) for r in range(WORLD)]
    memories = [torch.load(out / f"memory{r}.pt") for r in range(WORLD)]
    return data, records, memories


@pytest.mark.distributed
@pytest.mark.subprocess
def test_group_collectives_across_two_processes(two_ranks):
    _, records, _ = two_ranks
    for rank, record in enumerate(records):
        assert record["rank"] == [rank, WORLD]
        assert record["gathered"] == ["from 0", "from 1"]
        assert record["rounds"] == [0, 0, 0, 1, 1, 1, 1]


@pytest.mark.distributed
@pytest.mark.subprocess
def test_failure_on_one_rank_raises_on_every_rank(two_ranks):
    _, records, _ = two_ranks
    assert records[1]["peer_error"] == "image bad.png cannot be read"
    assert "bad.png" in records[0]["peer_error"] and "rank 1" in records[0]["peer_error"]


@pytest.mark.distributed
@pytest.mark.subprocess
def test_ranks_with_different_images_refuse_together(two_ranks):
    _, records, _ = two_ranks
    assert all("differ between processes" in record["mismatch"] for record in records)


@pytest.mark.distributed
@pytest.mark.subprocess
def test_disk_cache_encodes_each_entry_once_across_ranks(two_ranks):
    data, records, _ = two_ranks
    requests = make_requests(data)
    unique = {(r.path.name, tuple(r.size), r.flip) for r in requests}
    loaded = [
        (name, tuple(size), flip)
        for record in records
        for name, size, flip in record["disk"]["loaded"]
    ]
    assert sorted(loaded) == sorted(unique)  # every entry once, on exactly one rank
    assert all(record["disk"]["loaded"] for record in records)  # both ranks took a share
    assert sum(record["disk"]["stats"][0] for record in records) == len(unique)
    assert all(record["disk"]["stats"][1:] == [0, len(unique)] for record in records)
    assert len(list((data / "latents").glob("*.safetensors"))) == len(unique)
    for record in records:
        assert record["disk_again"] == {"stats": [0, len(unique), len(unique)], "loaded": []}
    cache = LatentCache("vae", torch.float32, to_disk=True)
    for request in requests:
        assert cache_file(data, cache.key(request)).exists()
        torch.testing.assert_close(cache.get(request).mean, expected_mean(request))


@pytest.mark.distributed
@pytest.mark.subprocess
def test_memory_cache_ends_with_every_entry_on_every_rank(two_ranks):
    data, records, memories = two_ranks
    requests = make_requests(data)
    assert sum(record["memory"]["stats"][0] for record in records) == 7
    first, second = memories
    assert first.keys() == second.keys() and len(first) == 7
    for request in requests:
        key = LatentCache("vae", torch.float32, to_disk=False).key(request)
        mean, std = fake_encode(load_pixels(request)[None])
        for memory in memories:
            torch.testing.assert_close(memory[key][0], mean[0])
            torch.testing.assert_close(memory[key][1], std[0])


def test_single_group_is_a_no_op():
    group = CacheGroup.single()
    group.barrier()
    assert (group.rank, group.world_size) == (0, 1)
    assert group.all_gather_object({"a": 1}) == [{"a": 1}]
    assert gather_in_rounds(group, [1, 2, 3], per_round=2) == [1, 2, 3]
    assert not dist.is_initialized()
    assert CacheGroup().world_size == 1  # without torch.distributed: one process


def test_single_group_reraises_the_error_itself():
    error = PeerFailed("boom")
    with pytest.raises(PeerFailed, match="boom"):
        gather_or_raise(CacheGroup.single(), 1, error, "testing")
    assert gather_or_raise(CacheGroup.single(), 5, None, "testing") == [5]
