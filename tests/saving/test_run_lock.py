"""One run per output name: the lock names its holder and dies with it."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from library.errors import ConfigError
from library.saving.run_lock import RunLock

REPO = Path(__file__).resolve().parents[2]

_HOLD = """
import sys, time
from library.saving.run_lock import RunLock
RunLock(sys.argv[1], "run").acquire()
print("held", flush=True)
time.sleep(120)
"""


def _holder(folder: Path) -> subprocess.Popen:
    process = subprocess.Popen(
        [sys.executable, "-c", _HOLD, str(folder)], cwd=REPO, stdout=subprocess.PIPE, text=True
    )
    assert process.stdout.readline().strip() == "held"
    return process


@pytest.mark.subprocess
def test_second_run_is_refused_naming_the_holder_until_it_is_killed(tmp_path):
    holder = _holder(tmp_path)
    try:
        with pytest.raises(ConfigError) as info:
            RunLock(tmp_path, "run").acquire()
        message = str(info.value)
        assert f"pid {holder.pid}" in message and "run.lock" in message and "\n" not in message
        RunLock(tmp_path, "other").acquire().release()  # another output name is free
    finally:
        os.kill(holder.pid, signal.SIGKILL)  # kill -9: no cleanup runs
        holder.wait()
    assert (tmp_path / "run.lock").exists()  # the dead run's file is left behind ...
    lock = RunLock(tmp_path, "run").acquire()  # ... and taken over
    assert str(os.getpid()) in (tmp_path / "run.lock").read_text()
    lock.release()
    assert not (tmp_path / "run.lock").exists()


def test_lock_in_an_unwritable_place_is_one_line(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(ConfigError, match="choose a writable output_dir"):
        RunLock(blocker / "out", "run").acquire()


def test_release_twice_is_harmless(tmp_path):
    lock = RunLock(tmp_path, "run").acquire()
    lock.release()
    lock.release()
    started = time.time()
    RunLock(tmp_path, "run").acquire().release()
    assert time.time() - started < 5
