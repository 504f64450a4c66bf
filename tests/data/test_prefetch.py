"""The read-ahead of a first scan (library/data/prefetch.py): what it asks the kernel for, how
far ahead of its reader, and that it leaves cached files alone."""

from __future__ import annotations

import os
import threading
import time

import pytest

from library.data import prefetch

pytestmark = pytest.mark.skipif(
    not hasattr(os, "posix_fadvise"), reason="no posix_fadvise here: nothing is read ahead"
)


@pytest.fixture
def files(tmp_path):
    paths = []
    for i in range(600):
        path = tmp_path / f"{i:04d}.txt"
        path.write_text(f"caption {i}")
        paths.append(str(path))
    return paths


@pytest.fixture
def advised(monkeypatch):
    """The files the thread advised, by name, in order."""
    names: list[str] = []
    lock = threading.Lock()

    def advise(fd, offset, length, advice):
        assert (offset, length, advice) == (0, prefetch.FIRST_BYTES, os.POSIX_FADV_WILLNEED)
        with lock:
            names.append(os.readlink(f"/proc/self/fd/{fd}"))

    monkeypatch.setattr(prefetch, "_ADVISE", advise)
    return names


def _settled(names: list, timeout: float = 5.0) -> int:
    """How many files were advised once the thread stopped advising more."""
    seen, deadline = -1, time.monotonic() + timeout
    while time.monotonic() < deadline:
        count = len(names)
        if count == seen:
            return count
        seen = count
        time.sleep(0.05)
    return len(names)


def test_cold_files_are_asked_for_in_order_at_most_the_window_ahead(files, advised, monkeypatch):
    monkeypatch.setattr(prefetch, "AHEAD", 40)
    monkeypatch.setattr(prefetch, "_cached", lambda fd: False)
    with prefetch.Prefetch(files) as ahead:
        read = 0
        for step in (0, 25, 100, 7, 300):
            read += step
            ahead.advance(step)
            assert _settled(advised) == min(len(files), read + 40)
    assert advised == [os.path.realpath(p) for p in files[: len(advised)]]


def test_cached_files_are_only_probed(files, advised, monkeypatch):
    probes = []
    monkeypatch.setattr(prefetch, "_cached", lambda fd: probes.append(fd) or True)
    with prefetch.Prefetch(files) as ahead:
        ahead.advance(len(files))
        _settled(probes)
    expected = [i for i in range(len(files)) if i < 64 or i % 256 == 0]  # 64 first, then 1 in 256
    assert (prefetch.PROBE_FIRST, prefetch.PROBE_EVERY) == (64, 256)
    assert len(probes) == len(expected)
    assert advised == []


def test_once_a_probe_finds_a_cold_file_every_later_file_is_asked_for(files, advised, monkeypatch):
    probed = []

    def cached(fd):
        probed.append(fd)
        return len(probed) <= 10  # the eleventh file is out of the page cache

    monkeypatch.setattr(prefetch, "_cached", cached)
    with prefetch.Prefetch(files) as ahead:
        ahead.advance(len(files))
        _settled(advised)
    assert advised == [os.path.realpath(p) for p in files[10:]]


def test_a_missing_file_is_left_to_the_reader_and_close_stops_a_waiting_thread(
    files, advised, monkeypatch
):
    monkeypatch.setattr(prefetch, "_cached", lambda fd: False)
    monkeypatch.setattr(prefetch, "AHEAD", 5)
    os.remove(files[2])
    ahead = prefetch.Prefetch(files)
    assert _settled(advised) == 4  # five ahead, the missing one skipped
    ahead.close()  # the thread waits for room: closing must not hang
    assert not any(t.name == "difftune-prefetch" and t.is_alive() for t in threading.enumerate())
    assert os.path.realpath(files[2]) not in advised


def test_files_dropped_from_the_page_cache_are_read_in(tmp_path):
    """On the real kernel: files whose pages were dropped are in the page cache after the
    prefetch, told by a read that may not wait (where the file system can drop them)."""
    if not hasattr(os, "RWF_NOWAIT"):
        pytest.skip("no RWF_NOWAIT probe here")
    paths = []
    for i in range(200):
        path = tmp_path / f"{i:03d}.png"
        path.write_bytes(os.urandom(3000))
        paths.append(str(path))
    os.sync()
    descriptors = [os.open(p, os.O_RDONLY) for p in paths]
    try:
        for fd in descriptors:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        if all(prefetch._cached(fd) for fd in descriptors):
            pytest.skip("this file system keeps the pages (tmpfs): nothing to read in")
        with prefetch.Prefetch(paths) as ahead:
            ahead.advance(len(paths))
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline and not all(map(prefetch._cached, descriptors)):
                time.sleep(0.05)
        assert all(prefetch._cached(fd) for fd in descriptors)
    finally:
        for fd in descriptors:
            os.close(fd)
