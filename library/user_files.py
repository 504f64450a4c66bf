"""Reading text files the user points us at, with one-line errors that name them."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from library.errors import ConfigError

# The largest text file read (a config, a dataset config, a prompts file: a few KiB each). A
# bound, so that a path to a device (/dev/zero), a pipe or a huge file never reads for ever.
MAX_TEXT_BYTES = 16 << 20


def read_user_text(path: str | Path, what: str) -> str:
    """The UTF-8 text of ``path`` (a leading BOM dropped); ConfigError naming ``what`` and the
    file when it is missing, not a regular file (a device or a pipe, which could be read for
    ever), larger than MAX_TEXT_BYTES, unreadable or not UTF-8."""
    try:
        mode = os.stat(path).st_mode  # before opening: opening a pipe waits for a writer
        if stat.S_ISDIR(mode):
            raise IsADirectoryError
        if not stat.S_ISREG(mode):
            raise ConfigError(
                f"{what} {path} is not a regular file (a device, pipe or socket); give the path "
                "of a text file"
            )
        with open(path, "rb") as file:
            data = file.read(MAX_TEXT_BYTES + 1)
    except FileNotFoundError:
        raise ConfigError(f"{what} not found: {path}") from None
    except IsADirectoryError:
        raise ConfigError(f"{what} {path} is a folder, not a file") from None
    except OSError as e:
        raise ConfigError(f"cannot read {what} {path}: {e.strerror}") from None
    if len(data) > MAX_TEXT_BYTES:
        raise ConfigError(
            f"{what} {path} is larger than {MAX_TEXT_BYTES >> 20} MiB, far more than a text file "
            "of settings or prompts holds; check the path"
        )
    try:
        return data.decode("utf-8-sig").replace("\r\n", "\n").replace("\r", "\n")
    except UnicodeDecodeError:
        raise ConfigError(f"{what} {path}: not UTF-8 text") from None


def starts_like_pickle(path: str | Path) -> bool:
    """Whether ``path`` starts as torch.save's files do: a zip archive, or a pickle stream
    (protocol 2 to 5) that is not a safetensors header (whose length may start with 0x80 too,
    but which a ``{`` follows at byte 8)."""
    try:
        with open(path, "rb") as file:
            head = file.read(9)
    except OSError:
        return False
    if head.startswith(b"PK\x03\x04"):
        return True
    return len(head) == 9 and head[0] == 0x80 and 2 <= head[1] <= 5 and head[8:9] != b"{"
