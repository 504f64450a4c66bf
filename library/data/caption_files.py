"""Reading a sidecar caption file: every non-empty line, with the checks a caption file gets.
No torch and no config imports, so a header worker (library.data.header_workers) reads caption
files too."""

from __future__ import annotations

import os
from pathlib import Path

from library.errors import DataError
from library.saving.sizes import format_size

# The most a caption (a caption file, or one entry of a metadata file) may hold. Real captions
# are a sentence or a tag list of a few KB, a wildcard file a few dozen lines; a file hundreds of
# times larger is something else saved under a caption's name (a log, a dump), and read whole
# and split into tags and tokens it takes gigabytes of memory.
MAX_CAPTION_BYTES = 1 << 20


def caption_too_long(what: str, size: int) -> str:
    """The message for a caption of ``size`` bytes above MAX_CAPTION_BYTES; ``what`` names it."""
    return (
        f"{what} holds {format_size(size)} ({size:,} bytes), more than the "
        f"{format_size(MAX_CAPTION_BYTES)} ({MAX_CAPTION_BYTES:,} bytes) a "
        "caption may have; a caption is a sentence or a tag list: check that this is the "
        "caption (not a log or other file saved under its name) and shorten it"
    )


def caption_lines(path: Path) -> str:
    """Every non-empty line of the sidecar caption file at ``path``, stripped, joined by
    newlines; DataError naming the file when it is too large, not UTF-8, unreadable or empty."""
    try:
        with open(path, "rb") as file:
            data = _read_at_most(file, MAX_CAPTION_BYTES + 1)  # never more: it may be huge
        if len(data) > MAX_CAPTION_BYTES:
            raise DataError(caption_too_long(f"caption file {path}", os.path.getsize(path)))
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as error:
        raise DataError(
            f"caption file {path} is not UTF-8 text ({error.reason} at byte {error.start}); "
            "save it as UTF-8"
        ) from error
    except OSError as error:
        raise DataError(
            f"caption file {path} cannot be read ({error.strerror}); fix its permissions or "
            "remove it"
        ) from error
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if lines:
        return "\n".join(lines)
    raise DataError(
        f"caption file {path} is empty; write a caption in it or delete it to use the class tokens"
    )


def _read_at_most(file, limit: int) -> bytes:
    """At most ``limit`` bytes of ``file``. It asks for the size the file has (plus one byte,
    to see a file that grew), not for ``limit``: a read of ``limit`` bytes sets aside that much
    memory first, and for a caption of a few bytes that is most of the cost of reading it."""
    size = os.fstat(file.fileno()).st_size
    data = file.read(min(size + 1, limit))
    if size < len(data) < limit:  # it grew, or its size says nothing (a pipe): read on
        data += file.read(limit - len(data))
    return data
