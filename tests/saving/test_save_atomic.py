"""Atomic file and folder writes: old outputs survive failures, nothing half-written remains."""

from __future__ import annotations

import errno
import os

import pytest

from library.errors import DifftuneError
from library.saving import atomic
from library.saving.atomic import SaveError, atomic_write_dir, atomic_write_file


def _boom(_tmp):
    raise RuntimeError("writer failed")


def test_file_is_written_with_usual_permissions(tmp_path):
    target = tmp_path / "sub" / "out.safetensors"
    atomic_write_file(target, lambda tmp: tmp.write_bytes(b"new"))
    assert target.read_bytes() == b"new"
    assert os.listdir(target.parent) == ["out.safetensors"]
    umask = os.umask(0)
    os.umask(umask)
    assert target.stat().st_mode & 0o777 == 0o666 & ~umask


def test_failed_writer_keeps_old_file(tmp_path):
    target = tmp_path / "out.safetensors"
    target.write_bytes(b"old")

    def half_then_fail(tmp):
        tmp.write_bytes(b"half")
        raise RuntimeError("writer failed")

    with pytest.raises(RuntimeError, match="writer failed"):
        atomic_write_file(target, half_then_fail)
    assert target.read_bytes() == b"old"
    assert os.listdir(tmp_path) == ["out.safetensors"]


def test_disk_full_is_one_clear_line(tmp_path, monkeypatch):
    target = tmp_path / "out.safetensors"
    target.write_bytes(b"old")

    def full(_fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(atomic.os, "fsync", full)
    with pytest.raises(SaveError) as err:
        atomic_write_file(target, lambda tmp: tmp.write_bytes(b"new"))
    message = str(err.value)
    assert isinstance(err.value, DifftuneError)
    assert str(target) in message and "no space left on device" in message
    assert "\n" not in message
    assert target.read_bytes() == b"old"
    assert os.listdir(tmp_path) == ["out.safetensors"]


def test_unwritable_folder_is_a_save_error(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(SaveError, match="cannot write"):
        atomic_write_file(blocker / "out.safetensors", lambda tmp: tmp.write_bytes(b"x"))


def _fill(content):
    def write(folder):
        (folder / "a.txt").write_text(content)
        (folder / "deep").mkdir()
        (folder / "deep" / "b.txt").write_text(content)

    return write


def test_folder_is_replaced_when_complete(tmp_path):
    target = tmp_path / "state"
    atomic_write_dir(target, _fill("one"))
    (target / "stale.txt").write_text("from the old save")
    atomic_write_dir(target, _fill("two"))
    assert sorted(p.name for p in target.iterdir()) == ["a.txt", "deep"]
    assert (target / "deep" / "b.txt").read_text() == "two"
    assert os.listdir(tmp_path) == ["state"]


def test_failed_folder_writer_keeps_old_folder(tmp_path):
    target = tmp_path / "state"
    atomic_write_dir(target, _fill("old"))
    with pytest.raises(RuntimeError):
        atomic_write_dir(target, _boom)
    assert (target / "a.txt").read_text() == "old"
    assert os.listdir(tmp_path) == ["state"]


def test_folder_disk_full(tmp_path):
    target = tmp_path / "state"
    atomic_write_dir(target, _fill("old"))

    def full(folder):
        raise OSError(errno.ENOSPC, "No space left on device")

    with pytest.raises(SaveError, match="state: no space left on device"):
        atomic_write_dir(target, full)
    assert (target / "a.txt").read_text() == "old"
    assert os.listdir(tmp_path) == ["state"]


def test_failed_swap_restores_old_folder(tmp_path, monkeypatch):
    target = tmp_path / "state"
    atomic_write_dir(target, _fill("old"))
    real_replace = os.replace

    def flaky(src, dst):
        if str(src).endswith(".tmp"):
            raise OSError(errno.EIO, "Input/output error")
        return real_replace(src, dst)

    monkeypatch.setattr(atomic.os, "replace", flaky)
    with pytest.raises(SaveError, match="Input/output error"):
        atomic_write_dir(target, _fill("new"))
    assert (target / "a.txt").read_text() == "old"
    assert os.listdir(tmp_path) == ["state"]


def test_folder_over_a_file_is_refused(tmp_path):
    target = tmp_path / "state"
    target.write_text("x")
    with pytest.raises(SaveError, match="a file of that name exists"):
        atomic_write_dir(target, _fill("x"))
