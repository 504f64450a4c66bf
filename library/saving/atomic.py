"""Write files and folders so that a crash or a full disk never leaves a half-written output.

Everything is first written beside its destination (same folder, so the same file system) and
then renamed into place; on failure the temporary is removed and the old output is untouched.
Temporaries are named ``.<output>.<random>.tmp`` (and ``.<output>.<random>.old`` for a replaced
folder while it is swapped out); a process killed with no chance to clean up (kill -9, power
loss) leaves them behind, and :func:`remove_leftovers` clears them before that output is written
again. Where other processes may be writing the same folder at the same time (a cache folder two
runs share), :func:`remove_stale_temporaries` removes only the temporary files no live process
is writing: on POSIX a file's writer holds a lock on it until the file is in place, and a lock
dies with its process.

A write that fails (disk full, no permission, I/O error) becomes a one-line SaveError naming the
destination, whichever writer failed: Python's OSError, safetensors' SafetensorError or torch's
RuntimeError from its zip writer. Any other exception is a bug, not a write failure, and passes
through unchanged.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import shutil
import stat
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from library.errors import DifftuneError

try:  # POSIX: a temporary being written holds an advisory lock (released when its writer dies)
    import fcntl
except ImportError:  # Windows, where an open file cannot be removed anyway
    fcntl = None


class SaveError(DifftuneError):
    """An output file or folder could not be written (disk full, no permission, ...).

    ``path`` and ``reason`` are set when the message has the form "cannot write PATH: REASON",
    so a caller can add what it did instead (e.g. where the weights went) without the hint.
    """

    # A run that fails here did train; 1 as for TrainingError ("could not finish, what could be
    # kept is named in the message"). 2 stays for input that is wrong before anything runs.
    exit_code = 1

    def __init__(
        self,
        message: str,
        path: Path | None = None,
        reason: str | None = None,
        fix: str | None = None,
    ):
        super().__init__(message)
        self.path = path
        self.reason = reason
        self.fix = fix  # "space" or "writable": the kind of hint the message ends with

    def naming(self, place: str) -> SaveError:
        """The same failure with its hint naming ``place`` (``--output``, ``cache_dir``) as
        the setting to change; itself when its message has no such hint."""
        if self.path is None or self.reason is None or self.fix is None:
            return self
        return _failure(self.path, self.reason, self.fix, place)


def _current_umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


# mkstemp/mkdtemp create private (0600/0700) entries; outputs get the usual permissions instead.
_UMASK = _current_umask()

NO_SPACE = "no space left on device"
# the end of a failed write's message, by kind, naming the setting that chose the destination
_HINTS = {"space": "free space or choose another {place}", "writable": "choose a writable {place}"}
# After a failed write the temporary still fills the disk; below this much free space a failure
# whose cause the writer did not report (torch gives no errno) is taken as a full disk.
NEARLY_FULL_BYTES = 16 * 2**20
# torch.save's zip writer reports a failed write as a RuntimeError from inline_container.cc
_TORCH_WRITE_FAILURE = re.compile(r"inline_container|PytorchStreamWriter|file write failed")
_ENFORCE_PREFIX = re.compile(r"^\[enforce fail at [^\]]*\]\s*\.?\s*")
_OS_ERROR_CODE = re.compile(r"\(os error (\d+)\)|\[Errno (\d+)\]")
_MAX_REASON = 200
# ".<output>.<random>.tmp" / ".old": mkstemp's random part has no dot
_TEMPORARY = re.compile(r"^\.(?P<output>.+)\.[^.]+\.(?P<kind>tmp|old)$")


def _first_line(text: str) -> str:
    """The message without the C++ backtrace torch appends, and not too long for one line."""
    line = next((part.strip() for part in text.splitlines() if part.strip()), "")
    line = _ENFORCE_PREFIX.sub("", line)
    return line if len(line) <= _MAX_REASON else line[: _MAX_REASON - 3] + "..."


def _chained_errno(exc: BaseException) -> int | None:
    """The errno of an OSError behind ``exc`` (torch raises its RuntimeError while handling one)."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, OSError) and current.errno:
            return current.errno
        current = current.__cause__ or current.__context__
    return None


def _is_safetensors_io_error(exc: BaseException) -> bool:
    try:
        from safetensors import SafetensorError
    except ImportError:  # pragma: no cover - safetensors is a dependency
        return False
    # other SafetensorErrors (bad tensors, bad metadata) are the caller's bugs, not write failures
    return isinstance(exc, SafetensorError) and "I/O error" in str(exc)


def _write_failure(exc: BaseException) -> tuple[int | None, str] | None:
    """(errno or None, one-line reason) when ``exc`` is a failed write; None for anything else."""
    if isinstance(exc, shutil.Error):  # copytree collects (src, dst, reason) of every failed file
        errors = exc.args[0] if exc.args and isinstance(exc.args[0], list) else []
        first = errors[0] if errors else None
        text = str(first[2]) if isinstance(first, tuple) and len(first) == 3 else str(exc)
        match = _OS_ERROR_CODE.search(text)
        code = int(match.group(1) or match.group(2)) if match else None
        return code, os.strerror(code) if code else _first_line(text)
    if isinstance(exc, OSError):
        return exc.errno, _first_line(exc.strerror or str(exc))
    if _is_safetensors_io_error(exc):
        text = str(exc)
        match = _OS_ERROR_CODE.search(text)
        reason = text.split("I/O error:", 1)[-1]
        reason = re.sub(r"\s*\(os error \d+\).*", "", reason, flags=re.DOTALL)
        return (int(match.group(1)) if match else None), _first_line(reason)
    if isinstance(exc, RuntimeError) and _TORCH_WRITE_FAILURE.search(str(exc)):
        code = _chained_errno(exc)
        return code, os.strerror(code) if code else f"write failed ({_first_line(str(exc))})"
    return None


def _nearly_full(folder: Path) -> bool:
    try:
        return shutil.disk_usage(folder).free < NEARLY_FULL_BYTES
    except OSError:
        return False


def _failure(path: Path, reason: str, fix: str | None, place: str) -> SaveError:
    hint = _HINTS[fix].format(place=place) if fix else None
    message = f"cannot write {path}: {reason}" + (f"; {hint}" if hint else "")
    return SaveError(message, path=path, reason=reason, fix=fix)


def _save_error(path: Path, exc: BaseException, place: str) -> SaveError | None:
    """``exc`` as a one-line SaveError naming ``path`` and, in its hint, the setting ``place``
    that chose it; None when it is not a write failure.

    Call it before the temporary is removed: a failed write's partial file is what shows the disk
    to be full when the writer gave no errno.
    """
    failure = _write_failure(exc)
    if failure is None:
        return None
    code, reason = failure
    if code is None and _nearly_full(path.parent):
        code = errno.ENOSPC
    fix = None
    if code == errno.ENOSPC:
        reason, fix = NO_SPACE, "space"
    elif code is not None and code == getattr(errno, "EDQUOT", None):  # not on Windows
        reason, fix = "disk quota exceeded", "space"
    elif code in (errno.EACCES, errno.EPERM, errno.EROFS):
        fix = "writable"
    return _failure(path, reason, fix, place)


def _fsync_path(path: Path, directory: bool = False) -> None:
    flags = os.O_RDONLY | (getattr(os, "O_DIRECTORY", 0) if directory else 0)
    fd = os.open(path, flags)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write_file(
    path: str | Path, write: Callable[[Path], None], place: str = "output_dir"
) -> Path:
    """Call ``write(tmp)`` to create a temporary file beside ``path``, then move it into place.

    The temporary is fsynced before the rename. On any exception it is removed and an existing
    ``path`` is left as it was; a failed write (see the module's docstring) becomes a one-line
    SaveError, chained to the writer's exception, whose hint names ``place``, the setting that
    chose the folder.
    """
    path = Path(path)
    tmp: Path | None = None
    held: int | None = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        tmp = Path(name)
        held = _held_while_written(fd)
        write(tmp)
        os.chmod(tmp, 0o666 & ~_UMASK)
        _fsync_path(tmp)
        os.replace(tmp, path)
        tmp = None
        with contextlib.suppress(OSError):  # not every file system can fsync a folder
            _fsync_path(path.parent, directory=True)
    except Exception as exc:
        error = _save_error(path, exc, place)
        if error is None:
            raise
        raise error from exc
    finally:
        if tmp is not None:
            tmp.unlink(missing_ok=True)
        if held is not None:
            os.close(held)
    return path


def _held_while_written(fd: int) -> int | None:
    """Lock the new temporary's descriptor ``fd`` and keep it open (POSIX), so that
    :func:`remove_stale_temporaries` sees the file is being written; else close it."""
    if fcntl is not None:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return fd
        except OSError:  # a file system without locks: the temporary's age alone tells
            pass
    os.close(fd)
    return None


def _fsync_tree(root: Path) -> None:
    for folder, _dirs, files in os.walk(root):
        for file in files:
            _fsync_path(Path(folder) / file)


def atomic_write_dir(path: str | Path, write: Callable[[Path], None]) -> Path:
    """Call ``write(tmp)`` to fill a temporary folder beside ``path``, then swap it in.

    An existing folder at ``path`` is moved aside only once the new one is complete and
    fsynced, and deleted after the new one is in place (restored if that rename fails).
    """
    path = Path(path)
    if path.exists() and not path.is_dir():
        reason = "a file of that name exists"
        raise SaveError(f"cannot write folder {path}: {reason}", path=path, reason=reason)
    tmp: Path | None = None
    old: Path | None = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent))
        os.chmod(tmp, 0o777 & ~_UMASK)
        write(tmp)
        _fsync_tree(tmp)
        if path.exists():
            old = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".old", dir=path.parent))
            os.replace(path, old)  # renaming onto an empty folder replaces it
        try:
            os.replace(tmp, path)
        except OSError:
            if old is not None:
                restore, old = old, None  # never delete the only copy of the previous output
                os.replace(restore, path)
            raise
        tmp = None
    except Exception as exc:
        error = _save_error(path, exc, "output_dir")
        if error is None:
            raise
        raise error from exc
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    return path


def temporary_of(entry: str) -> str | None:
    """The output whose atomic write made the temporary named ``entry``; None when ``entry``
    is not such a temporary."""
    match = _TEMPORARY.match(entry)
    return match.group("output") if match else None


def remove_leftovers(folder: str | Path, outputs: Callable[[str], bool]) -> list[Path]:
    """Remove the temporaries that killed atomic writes of ``folder``'s outputs whose names
    ``outputs`` accepts left behind; return them. Call only while no other process can be
    writing those outputs (while holding their lock).

    A previous folder set aside (``.old``) whose output is missing was the only copy of it (a
    write killed between its two renames): it is moved back instead of removed.
    """
    folder = Path(folder)
    if not folder.is_dir():
        return []
    removed = []
    for path in sorted(folder.iterdir()):
        output = temporary_of(path.name)
        if output is None or not outputs(output):
            continue
        target = folder / output
        if path.name.endswith(".old") and path.is_dir() and not os.path.lexists(target):
            os.replace(path, target)
            continue
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)
        removed.append(path)
    return removed


# A temporary younger than this may be between its creation and its writer's lock; one that
# cannot be locked at all (no flock on the file system, or Windows) must be much older.
FRESH_TEMPORARY_S = 60
UNLOCKABLE_TEMPORARY_S = 24 * 3600


def _written_now(path: Path) -> bool | None:
    """Whether a live process holds ``path``'s writer lock; None when it cannot be told."""
    if fcntl is None:
        return None
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    except OSError:
        return None
    finally:
        os.close(fd)  # also releases the lock just taken
    return False


def remove_stale_temporaries(
    folder: str | Path, outputs: Callable[[str], bool], now: float | None = None
) -> list[Path]:
    """Remove the temporary files of ``folder``'s outputs whose names ``outputs`` accepts that
    killed writes left behind; return them. Safe while other processes write to ``folder``: a
    temporary is removed only when no live process is writing it (its writer's lock is free,
    and it is older than FRESH_TEMPORARY_S; UNLOCKABLE_TEMPORARY_S where locks cannot tell)."""
    folder = Path(folder)
    try:
        entries = sorted(folder.iterdir())
    except OSError:  # no such folder yet, or unreadable: nothing of ours to clear
        return []
    now = time.time() if now is None else now
    removed = []
    for path in entries:
        match = _TEMPORARY.match(path.name)
        if match is None or match.group("kind") != "tmp" or not outputs(match.group("output")):
            continue
        try:
            info = path.lstat()
        except OSError:
            continue
        if not stat.S_ISREG(info.st_mode):
            continue
        live = _written_now(path)
        age = now - info.st_mtime
        if live or age < (UNLOCKABLE_TEMPORARY_S if live is None else FRESH_TEMPORARY_S):
            continue
        with contextlib.suppress(OSError):  # gone already, or (Windows) still open
            path.unlink()
            removed.append(path)
    return removed
