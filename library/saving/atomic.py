"""Write files and folders so that a crash or a full disk never leaves a half-written output.

Everything is first written beside its destination (same folder, so the same file system) and
then renamed into place; on failure the temporary is removed and the old output is untouched.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

from library.errors import DifftuneError


class SaveError(DifftuneError):
    """An output file or folder could not be written (disk full, no permission, ...)."""


def _current_umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


# mkstemp/mkdtemp create private (0600/0700) entries; outputs get the usual permissions instead.
_UMASK = _current_umask()


def _save_error(path: Path, exc: OSError) -> SaveError:
    reason = exc.strerror or str(exc)
    if exc.errno == errno.ENOSPC:
        reason = "no space left on device; free space or choose another output_dir"
    elif exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        reason = f"{reason}; choose a writable output_dir"
    return SaveError(f"cannot write {path}: {reason}")


def _fsync_path(path: Path, directory: bool = False) -> None:
    flags = os.O_RDONLY | (getattr(os, "O_DIRECTORY", 0) if directory else 0)
    fd = os.open(path, flags)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write_file(path: str | Path, write: Callable[[Path], None]) -> Path:
    """Call ``write(tmp)`` to create a temporary file beside ``path``, then move it into place.

    The temporary is fsynced before the rename. On any exception it is removed and an existing
    ``path`` is left as it was; OSErrors (disk full, permissions) become one-line SaveErrors.
    """
    path = Path(path)
    tmp: Path | None = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        os.close(fd)
        tmp = Path(name)
        write(tmp)
        os.chmod(tmp, 0o666 & ~_UMASK)
        _fsync_path(tmp)
        os.replace(tmp, path)
        tmp = None
        with contextlib.suppress(OSError):  # not every file system can fsync a folder
            _fsync_path(path.parent, directory=True)
    except OSError as exc:
        raise _save_error(path, exc) from exc
    finally:
        if tmp is not None:
            tmp.unlink(missing_ok=True)
    return path


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
        raise SaveError(f"cannot write folder {path}: a file of that name exists")
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
    except OSError as exc:
        raise _save_error(path, exc) from exc
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    return path
