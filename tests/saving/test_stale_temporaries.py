"""Temporary files of killed writes in folders other processes may be writing at the same time
(a cache folder two runs share): removed only when no live process writes them, and only ours."""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from library.saving import atomic
from library.saving.atomic import SaveError, atomic_write_file, remove_stale_temporaries

REPO = Path(__file__).resolve().parents[2]
LATER = time.time() + 7 * 24 * 3600  # "now" a week on: every temporary is old enough by age
ENTRY = "0123456789abcdef0123456789abcdef.safetensors"


def ours(name: str) -> bool:
    return name.endswith(".safetensors")


def leftover(
    folder: Path, output: str = ENTRY, random: str = "k1ll3d", age_s: float = 3600
) -> Path:
    """A temporary as a killed atomic write leaves it: ``.<output>.<random>.tmp``, unlocked."""
    path = folder / f".{output}.{random}.tmp"
    path.write_bytes(b"half")
    then = time.time() - age_s
    os.utime(path, (then, then))
    return path


def test_only_old_unlocked_temporaries_of_our_outputs_are_removed(tmp_path):
    stale = leftover(tmp_path)
    fresh = leftover(tmp_path, random="n0w", age_s=0)  # may not be locked by its writer yet
    foreign = leftover(tmp_path, output="notes.txt")  # a name the caller does not own
    users = tmp_path / "scratch.tmp"
    users.write_bytes(b"mine")
    (tmp_path / f".{ENTRY}.d1r.tmp").mkdir()  # not a file an entry's write makes
    assert remove_stale_temporaries(tmp_path, ours) == [stale]
    assert not stale.exists()
    assert fresh.exists() and foreign.exists() and users.exists()
    assert (tmp_path / f".{ENTRY}.d1r.tmp").is_dir()
    assert remove_stale_temporaries(tmp_path / "missing", ours) == []


@pytest.mark.skipif(atomic.fcntl is None, reason="writer locks are POSIX flock")
def test_a_temporary_being_written_is_kept_however_old(tmp_path):
    target = tmp_path / ENTRY
    seen = {}

    def write(tmp: Path) -> None:
        tmp.write_bytes(b"data")
        os.utime(tmp, (0, 0))  # as old as can be: only the writer's lock can keep it
        seen["removed"] = remove_stale_temporaries(tmp_path, ours, now=LATER)
        seen["there"] = tmp.exists()

    atomic_write_file(target, write)
    assert seen == {"removed": [], "there": True}
    assert target.read_bytes() == b"data"


_WRITER = """
import sys, time
from pathlib import Path
from library.saving.atomic import atomic_write_file
def write(tmp):
    tmp.write_bytes(b"half")
    print(tmp, flush=True)
    time.sleep(300)
atomic_write_file(Path(sys.argv[1]), write)
"""


@pytest.mark.subprocess
@pytest.mark.skipif(atomic.fcntl is None, reason="writer locks are POSIX flock")
def test_another_process_writing_keeps_its_temporary_until_it_is_killed(tmp_path):
    writer = subprocess.Popen(
        [sys.executable, "-c", _WRITER, str(tmp_path / ENTRY)],
        cwd=REPO, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        tmp = Path(writer.stdout.readline().strip())
        assert tmp.parent == tmp_path and tmp.exists()
        assert remove_stale_temporaries(tmp_path, ours, now=LATER) == []  # it is alive
        assert tmp.exists()
    finally:
        writer.send_signal(signal.SIGKILL)
        writer.wait()
    assert tmp.exists()  # killed with no chance to clean up
    assert remove_stale_temporaries(tmp_path, ours, now=LATER) == [tmp]
    assert not tmp.exists() and not (tmp_path / ENTRY).exists()


def _full(_fd):
    raise OSError(errno.ENOSPC, "No space left on device")


def test_a_full_disk_names_the_setting_that_chose_the_folder(tmp_path, monkeypatch):
    monkeypatch.setattr(atomic.os, "fsync", _full)
    target = tmp_path / ENTRY
    with pytest.raises(SaveError) as failed:
        atomic_write_file(target, lambda tmp: tmp.write_bytes(b"x"), "cache folder (cache_dir)")
    assert str(failed.value) == (
        f"cannot write {target}: no space left on device; free space or choose another "
        "cache folder (cache_dir)"
    )
    with pytest.raises(SaveError) as failed:
        atomic_write_file(target, lambda tmp: tmp.write_bytes(b"x"))
    default = failed.value
    assert str(default).endswith("; free space or choose another output_dir")
    renamed = default.naming("--output")
    assert str(renamed) == (
        f"cannot write {target}: no space left on device; free space or choose another --output"
    )
    assert (renamed.path, renamed.reason) == (default.path, default.reason)
    assert SaveError("could not save").naming("--output").args == ("could not save",)
    assert os.listdir(tmp_path) == []
