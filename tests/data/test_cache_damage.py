"""Latent cache files whose header (the key parts) was kept but whose tensors were changed.

Each damage must be found where the build decides what is missing, so that exactly that entry is
encoded again, with one warning naming the file, and the entry then equals a fresh encode; a
file damaged after the build is refused by `get` rather than trained on.
"""

from __future__ import annotations

import logging
import threading

import pytest
import torch

from library.data.content_hash import all_finite, tensor_digest
from library.data.latent_cache import LatentCache, LatentRequest, cache_file
from library.errors import DataError
from tests.cache_tamper import (
    checksum_key,
    drop_checksum,
    garbage_tensor_bytes,
    put_nan,
    rewrite,
    scale_by_two,
)
from tests.data.test_latent_cache import (
    SIZE,
    Counting,
    build,
    expected_mean,
    fake_encode,
    load_pixels,
    requests_for,
    write_png,
)


@pytest.fixture
def images(tmp_path):
    return [write_png(tmp_path / "imgs" / f"{i}.png", seed=i) for i in range(3)]







def flatten_mean_with_checksum(tensors, meta):
    tensors["mean"] = tensors["mean"].reshape(4, -1).contiguous()
    meta[checksum_key(meta)] = tensor_digest(tensors)



DAMAGES = {
    "mean scaled by 2": (lambda f: rewrite(f, scale_by_two("mean")), "checksum mismatch"),
    "std scaled by 2": (lambda f: rewrite(f, scale_by_two("std")), "checksum mismatch"),
    "random bytes": (garbage_tensor_bytes, "checksum mismatch"),
    "a NaN in std": (lambda f: rewrite(f, put_nan("std")), "checksum mismatch"),
    "a NaN, checksum forged": (lambda f: rewrite(f, put_nan("mean", True)), "non-finite"),
    "no checksum": (lambda f: rewrite(f, drop_checksum), "no checksum"),
    "wrong shape, checksum forged": (
        lambda f: rewrite(f, flatten_mean_with_checksum),
        "wrong shapes",
    ),
}


def damage_warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if "was damaged" in r.getMessage()]


@pytest.mark.parametrize("damage", list(DAMAGES))
def test_damaged_entry_is_refused_then_reencoded_alone(images, tmp_path, caplog, damage):
    tamper, reason = DAMAGES[damage]
    requests = requests_for(images, tmp_path)
    build(LatentCache("vae", torch.float32, to_disk=True), requests)
    file = cache_file(tmp_path, LatentCache("vae", torch.float32, True).key(requests[1]))
    tamper(file)

    fresh = LatentCache("vae", torch.float32, to_disk=True)
    # Read in training (after a build that saw it intact): refused, naming the file and the fix.
    with pytest.raises(DataError, match=f"{file.name}.*damaged \\({reason}.*delete it"):
        fresh.get(requests[1])

    caplog.clear()
    with caplog.at_level(logging.WARNING):
        stats, counting = build(fresh, requests)
    assert counting.encoded == 1 and set(counting.loaded) == {("1.png", SIZE, False)}
    assert (stats.encoded_here, stats.reused, stats.total, stats.damaged) == (1, 2, 3, 1)
    [warning] = damage_warnings(caplog)
    assert warning.startswith(f"latent cache entry {file} was damaged ({reason}")
    assert warning.endswith("; re-encoded")

    for request in requests:
        entry = fresh.get(request)
        torch.testing.assert_close(entry.mean, expected_mean(request))
        torch.testing.assert_close(entry.std, torch.sigmoid(expected_mean(request)))
        assert entry.original_size == (30, 40) and entry.crop_top_left == (0, 1)

    # The file was rewritten whole: the next build finds everything and warns of nothing.
    caplog.clear()
    stats, counting = build(LatentCache("vae", torch.float32, to_disk=True), requests)
    assert counting.encoded == 0 and stats.damaged == 0 and not damage_warnings(caplog)


def test_untouched_entries_are_hits_without_warnings(images, tmp_path, caplog):
    requests = requests_for(images, tmp_path, alpha=True)
    build(LatentCache("vae", torch.float32, to_disk=True), requests)
    caplog.clear()
    again = LatentCache("vae", torch.float32, to_disk=True)
    stats, counting = build(again, requests)
    assert counting.encoded == 0 and not counting.loaded
    assert (stats.reused, stats.damaged) == (3, 0) and not damage_warnings(caplog)
    entry = again.get(requests[0])
    torch.testing.assert_close(entry.alpha, (load_pixels(requests[0])[:1] + 1) / 2)


def test_damaged_alpha_is_found_too(images, tmp_path, caplog):
    requests = requests_for(images, tmp_path, alpha=True)
    cache = LatentCache("vae", torch.float32, to_disk=True)
    build(cache, requests)
    file = cache_file(tmp_path, cache.key(requests[2]))
    rewrite(file, scale_by_two("alpha"))
    with pytest.raises(DataError, match="checksum mismatch"):
        cache.get(requests[2])  # the same cache, as training would read it after its build
    with caplog.at_level(logging.WARNING):
        stats, counting = build(LatentCache("vae", torch.float32, to_disk=True), requests)
    assert set(counting.loaded) == {("2.png", SIZE, False)} and stats.damaged == 1
    assert len(damage_warnings(caplog)) == 1
    torch.testing.assert_close(cache.get(requests[2]).alpha, (load_pixels(requests[2])[:1] + 1) / 2)


def test_encoder_nan_is_refused_naming_the_image(images, tmp_path):
    def nan_for_the_second(pixels):
        mean, std = fake_encode(pixels)
        std[1, 0, 0, 0] = float("inf")
        return mean, std

    requests = requests_for(images, tmp_path)
    for to_disk in (False, True):
        cache = LatentCache("vae", torch.float32, to_disk=to_disk)
        with pytest.raises(DataError, match="NaN or Inf latents for .*1.png"):
            cache.build(requests, nan_for_the_second, Counting().load, batch_size=3)
    assert not list(tmp_path.glob("latents/*.safetensors"))


class ThreadGroup:
    """A CacheGroup for ranks run as threads of this process (all_gather_object, barrier)."""

    def __init__(self, rank: int, slots: list, barrier: threading.Barrier) -> None:
        self.rank, self.world_size = rank, len(slots)
        self._slots, self._barrier = slots, barrier

    def barrier(self) -> None:
        self._barrier.wait()

    def all_gather_object(self, obj) -> list:
        self._slots[self.rank] = obj
        self._barrier.wait()
        gathered = list(self._slots)
        self._barrier.wait()  # nobody overwrites a slot before every rank has copied them
        return gathered


def build_on_two_ranks(requests: list[LatentRequest]) -> list:
    """(stats, Counting) of each rank of a two-rank disk build, ranks run as threads."""
    slots, barrier = [None, None], threading.Barrier(2, timeout=60)
    results: list = [None, None]

    def run(rank: int) -> None:
        counting = Counting()
        cache = LatentCache("vae", torch.float32, to_disk=True)
        group = ThreadGroup(rank, slots, barrier)
        stats = cache.build(requests, counting.encode, counting.load, 2, rank, 2, group)
        results[rank] = (stats, counting)

    threads = [threading.Thread(target=run, args=(rank,)) for rank in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert all(results), "a rank failed"
    return results


def test_two_ranks_reencode_a_damaged_entry_once_with_one_warning(images, tmp_path, caplog):
    requests = requests_for(images, tmp_path)
    build_on_two_ranks(requests)
    # Entry 1 has its tensors read by rank 1 only; as the only missing entry it falls to rank 0.
    file = cache_file(tmp_path, LatentCache("vae", torch.float32, True).key(requests[1]))
    rewrite(file, scale_by_two("mean"))
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        (stats0, counting0), (stats1, counting1) = build_on_two_ranks(requests)
    assert set(counting0.loaded) == {("1.png", SIZE, False)} and not counting1.loaded
    assert (stats0.encoded_here, stats1.encoded_here) == (1, 0)
    assert stats0.damaged == stats1.damaged == 1 and stats0.reused == stats1.reused == 2
    assert damage_warnings(caplog) == [
        f"latent cache entry {file} was damaged (checksum mismatch); re-encoded"
    ]
    entry = LatentCache("vae", torch.float32, to_disk=True).get(requests[1])
    torch.testing.assert_close(entry.mean, expected_mean(requests[1]))


def test_all_finite_is_exact_where_a_plain_sum_would_overflow():
    big = torch.full((1000,), torch.finfo(torch.float32).max)
    assert torch.isinf(big.sum()) and all_finite(big) and all_finite(big.half().clamp(-6e4, 6e4))
    for bad in (float("nan"), float("inf"), float("-inf")):
        tensor = torch.zeros(4, 8, 8)
        tensor[2, 3, 4] = bad
        assert not all_finite(tensor) and not all_finite(tensor.to(torch.bfloat16))
    both = torch.tensor([float("inf"), float("-inf"), 1.0])
    assert not all_finite(both)
    assert all_finite(torch.arange(5))
