"""One run per output name: an exclusive lock on ``<output_dir>/<output_name>.lock``.

The lock is an OS file lock (flock on POSIX, msvcrt on Windows), so it is released when the
process ends in any way, kill -9 included; a lock file left behind by a dead run is simply taken
over. The file holds who has it (pid, host, start time) for the message a second run prints.
Locks on network file systems are only as reliable as the file system's own locking.
"""

from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path

from library.errors import ConfigError

try:  # POSIX
    import fcntl

    def _try_lock(fd: int) -> bool:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        return True

except ImportError:  # Windows
    import msvcrt

    def _try_lock(fd: int) -> bool:
        try:
            msvcrt.locking(fd, msvcrt.LK_NBLCK, 1)
        except OSError:
            return False
        return True


class RunLock:
    """Held for the life of a run; ``acquire`` raises ConfigError naming the holder."""

    def __init__(self, output_dir: str | Path, output_name: str):
        self.path = Path(output_dir) / f"{output_name}.lock"
        self._fd: int | None = None

    def acquire(self) -> RunLock:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            raise ConfigError(
                f"cannot create {self.path} ({exc.strerror}); choose a writable output_dir"
            ) from None
        if not _try_lock(fd):
            holder = _describe(fd)
            os.close(fd)
            raise ConfigError(
                f"another run is writing this output name ({holder}; lock {self.path}); wait "
                "for it to finish, or choose another output_name or output_dir"
            )
        self._fd = fd
        info = {"pid": os.getpid(), "host": socket.gethostname(), "started": time.time()}
        os.ftruncate(fd, 0)
        os.lseek(fd, 0, os.SEEK_SET)
        os.write(fd, json.dumps(info).encode())
        return self

    def release(self) -> None:
        """Remove the lock file and release the lock (closing the descriptor releases it)."""
        if self._fd is None:
            return
        # unlink first: a run waiting on this file then creates a fresh one instead of locking a
        # name that no longer exists
        self.path.unlink(missing_ok=True)
        os.close(self._fd)
        self._fd = None

    def __enter__(self) -> RunLock:
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()


def _describe(fd: int) -> str:
    try:
        os.lseek(fd, 0, os.SEEK_SET)
        info = json.loads(os.read(fd, 4096).decode() or "{}")
        started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(info["started"]))
        return f"pid {info['pid']} on {info['host']}, started {started}"
    except (OSError, ValueError, KeyError, TypeError):
        return "a process that has not written its details yet"
