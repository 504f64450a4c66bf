"""Does writing an output touch an input? The one answer the trainer and every toolbox command
that writes use before anything loads.

An output touches an input when it is the input, lies inside an input folder, or is a folder
(replaced whole) that holds the input; or when the two are hard links of one file. Paths are
compared where they really are: symlinks and ``..`` are resolved, and both where a path's
directory entry sits and where it points count, since an atomic write replaces the entry and a
folder write replaces what is inside.

An output may also be a family of names in a folder (a trainer run writes every name its
output_name owns in output_dir): ``owns`` then says which entry names of ``written`` are
written.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

SAME = "is"
OUTPUT_INSIDE = "lies inside"
HOLDS = "holds"
HARD_LINK = "is a hard link of"


@dataclass(frozen=True)
class Clash:
    """How writing ``output`` touches an input: ``relation`` is one of the phrases above, read
    as "<output> <relation> <input>"."""

    output: Path
    relation: str


def _places(path: Path) -> set[Path]:
    """Where ``path``'s directory entry really is, and where it points to."""
    real = Path(os.path.realpath(path))  # symlinks first, then "..", as the OS reads it
    if path.name in ("", ".", ".."):
        return {real}
    return {Path(os.path.realpath(path.parent)) / path.name, real}


def _under(inner: Path, outer: Path) -> bool:
    return outer in inner.parents


def clash(
    written: str | Path, source: str | Path, owns: Callable[[str], bool] | None = None
) -> Clash | None:
    """How writing ``written`` would touch the input ``source``, or None when it would not.

    Without ``owns``, ``written`` is one file or folder (existing or not). With ``owns``, it is
    a folder of which the entries whose names ``owns`` accepts are written (or deleted). An
    input that does not exist is not touched: whatever reads it reports that.
    """
    written, source = Path(written), Path(source)
    if not os.path.lexists(source):
        return None
    if owns is not None:
        return _clash_in_folder(written, source, owns)
    for target in _places(written):
        for place in _places(source):
            if target == place:
                return Clash(written, SAME)
            if _under(target, place):
                return Clash(written, OUTPUT_INSIDE)
            if _under(place, target):
                return Clash(written, HOLDS)
    return _hard_link(written, source)


def _clash_in_folder(folder: Path, source: Path, owns: Callable[[str], bool]) -> Clash | None:
    """``clash`` for the entries of ``folder`` that ``owns`` accepts, written or not yet."""
    for target in _places(folder):
        for place in _places(source):
            if target == place or _under(target, place):  # the folder itself is in the input
                return Clash(folder, OUTPUT_INSIDE)
            if _under(place, target):
                entry = place.relative_to(target).parts[0]
                if owns(entry):
                    return Clash(folder / entry, SAME if target / entry == place else HOLDS)
    if not folder.is_dir():
        return None
    for entry in sorted(folder.iterdir()):  # an existing one may be a link to the input
        if owns(entry.name):
            found = clash(entry, source)
            if found is not None:
                return found
    return None


def _hard_link(written: Path, source: Path) -> Clash | None:
    """An existing output file that is the input file under another name."""
    try:
        if written.is_file() and source.is_file() and os.path.samefile(written, source):
            return Clash(written, HARD_LINK)
    except OSError:
        pass
    return None
