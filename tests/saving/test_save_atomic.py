"""Atomic file and folder writes: old outputs survive failures, nothing half-written remains."""

from __future__ import annotations

import contextlib
import errno
import os
import re
import resource
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors import SafetensorError
from safetensors.torch import save_file

from library.errors import DifftuneError
from library.saving import atomic
from library.saving.atomic import SaveError, atomic_write_dir, atomic_write_file

REPO = Path(__file__).resolve().parents[2]


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


# --- failures of the real writers: torch.save and safetensors, as they raise them --------------

DEV_FULL = Path("/dev/full")  # Linux: every write fails with ENOSPC
needs_dev_full = pytest.mark.skipif(not DEV_FULL.exists(), reason="needs Linux's /dev/full")


def _one_line_no_space(message: str, target: Path) -> None:
    assert "\n" not in message
    assert message.startswith(f"cannot write {target}: no space left on device")
    assert "choose another output_dir" in message


@needs_dev_full
def test_torch_save_on_a_full_device_is_one_line(tmp_path):
    # torch's zip writer turns the device's ENOSPC into a RuntimeError "[enforce fail at
    # inline_container.cc...]"; the OSError it was raised from carries the errno
    target = tmp_path / "optimizer.pt"
    target.write_bytes(b"old")

    def write(_tmp):
        handle = open(DEV_FULL, "wb")  # noqa: SIM115 - closed below, after torch's error
        try:
            torch.save({"exp_avg": torch.zeros(10_000)}, handle)
        finally:
            with contextlib.suppress(OSError):
                handle.close()

    with pytest.raises(SaveError) as err:
        atomic_write_file(target, write)
    _one_line_no_space(str(err.value), target)
    assert isinstance(err.value.__cause__, RuntimeError)
    assert "inline_container" in str(err.value.__cause__)
    assert target.read_bytes() == b"old" and os.listdir(tmp_path) == ["optimizer.pt"]


def _torch_save_through_dev_full(tmp):
    tmp.unlink()
    tmp.symlink_to(DEV_FULL)  # the temporary itself is the full device
    torch.save({"exp_avg": torch.zeros(10_000)}, tmp)


@needs_dev_full
def test_torch_write_failure_without_errno_checks_free_space(tmp_path, monkeypatch):
    # torch.save to a path reports no errno at all; a disk left (nearly) full by the failed write
    # is how the cause shows
    target = tmp_path / "optimizer.pt"
    with pytest.raises(SaveError) as err:
        atomic_write_file(target, _torch_save_through_dev_full)
    message = str(err.value)
    assert "\n" not in message and message.startswith(f"cannot write {target}: write failed (")
    assert "no space" not in message  # this disk has room: no guessing
    assert os.listdir(tmp_path) == []

    full = shutil.disk_usage(tmp_path)._replace(free=4096)
    monkeypatch.setattr(atomic.shutil, "disk_usage", lambda _path: full)
    with pytest.raises(SaveError) as err:
        atomic_write_file(target, _torch_save_through_dev_full)
    _one_line_no_space(str(err.value), target)


@pytest.mark.subprocess
@needs_dev_full
def test_torch_cpp_backtrace_is_not_in_the_message(tmp_path):
    # With TORCH_SHOW_CPP_STACKTRACES=1 torch appends a C++ backtrace to the message (the
    # "two C++ tracebacks" users saw); it is read when torch starts, hence a fresh interpreter.
    target = tmp_path / "optimizer.pt"
    script = (
        "import sys, torch\n"
        "from pathlib import Path\n"
        "from library.saving.atomic import SaveError, atomic_write_file\n"
        "def write(tmp):\n"
        "    tmp.unlink(); tmp.symlink_to('/dev/full')\n"
        "    torch.save({'a': torch.zeros(10000)}, tmp)\n"
        "try:\n"
        f"    atomic_write_file(Path({str(target)!r}), write)\n"
        "except SaveError as exc:\n"
        "    print('CAUSE', repr(str(exc.__cause__)))\n"
        "    print('MESSAGE', exc)\n"
    )
    env = {**os.environ, "TORCH_SHOW_CPP_STACKTRACES": "1", "TORCH_DISABLE_ADDR2LINE": "1"}
    done = subprocess.run(
        [sys.executable, "-c", script],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    lines = done.stdout.splitlines()
    cause = next(line for line in lines if line.startswith("CAUSE"))
    assert "C++ CapturedTraceback" in cause  # torch did add its backtrace
    messages = [line for line in lines if line.startswith("MESSAGE")]
    assert len(messages) == 1, done.stdout + done.stderr
    reason = r"write failed \(unexpected pos \d+ vs \d+\)"
    expected = rf"MESSAGE cannot write {re.escape(str(target))}: {reason}"
    assert re.fullmatch(expected, messages[0]), messages[0]


@pytest.fixture
def file_size_limit():
    """Limit files this process writes to 64 KiB: writes past it fail for real (EFBIG)."""
    previous = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # else the kernel kills us
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)

    @contextlib.contextmanager
    def limited():
        resource.setrlimit(resource.RLIMIT_FSIZE, (64 * 1024, hard))
        try:
            yield
        finally:
            resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))

    yield limited
    signal.signal(signal.SIGXFSZ, previous)


def test_safetensors_io_error_is_one_line(tmp_path, file_size_limit):
    target = tmp_path / "run.safetensors"
    target.write_bytes(b"old")
    with file_size_limit(), pytest.raises(SaveError) as err:
        atomic_write_file(target, lambda tmp: save_file({"w": torch.zeros(100_000)}, str(tmp)))
    assert str(err.value) == f"cannot write {target}: File too large"
    assert isinstance(err.value.__cause__, SafetensorError)
    assert target.read_bytes() == b"old" and os.listdir(tmp_path) == ["run.safetensors"]


def test_safetensors_disk_full_is_one_line(tmp_path):
    # what safetensors raises when the device is full (its Rust io::Error, errno 28)
    target = tmp_path / "run.safetensors"

    def full(_tmp):
        raise SafetensorError(
            "Error while serializing: I/O error: No space left on device (os error 28)"
        )

    with pytest.raises(SaveError) as err:
        atomic_write_file(target, full)
    _one_line_no_space(str(err.value), target)
    assert err.value.path == target and err.value.reason == "no space left on device"


def test_copied_folder_failure_is_one_line(tmp_path, file_size_limit):
    # the diffusers folder is written with shutil.copytree, which gathers every failed file
    source = tmp_path / "base"
    source.mkdir()
    for name in ("vae.bin", "te.bin"):
        (source / name).write_bytes(b"x" * 200_000)
    target = tmp_path / "out" / "model"
    with file_size_limit(), pytest.raises(SaveError) as err:
        atomic_write_dir(target, lambda tmp: shutil.copytree(source, tmp / "copy"))
    assert str(err.value) == f"cannot write {target}: File too large"
    assert os.listdir(target.parent) == []


def test_bugs_in_a_writer_are_not_save_errors(tmp_path):
    # only failed writes become SaveErrors; a wrong tensor or a torch error unrelated to
    # writing reaches the caller as it was raised
    target = tmp_path / "run.safetensors"
    with pytest.raises(ValueError, match="non contiguous"):
        atomic_write_file(target, lambda tmp: save_file({"w": torch.zeros(4)[::2]}, str(tmp)))
    with pytest.raises(RuntimeError, match="size of tensor"):
        atomic_write_file(target, lambda tmp: torch.zeros(2) + torch.zeros(3))
    assert os.listdir(tmp_path) == []


def test_a_failed_write_exits_with_code_1(tmp_path):
    # the run did train: 1 as for a TrainingError; 2 means input refused before anything ran
    def broken_disk(_tmp):
        raise OSError(errno.EIO, "Input/output error")

    with pytest.raises(SaveError) as err:
        atomic_write_file(tmp_path / "x", broken_disk)
    assert str(err.value) == f"cannot write {tmp_path / 'x'}: Input/output error"
    assert err.value.exit_code == 1
