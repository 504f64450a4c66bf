"""How difftune treats a kohya key it knows but does not implement (see library.config.kohya)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Unsupported:
    """A kohya key difftune does not implement."""

    reason: str
    off: tuple = ()  # values that mean "off" (kohya's defaults); accepted and dropped
    planned: bool = True  # "not supported yet" rather than "not supported"
    # changes nothing here (it only acts together with another unsupported key, or only tunes
    # how kohya itself loads files): any value is dropped, with a note when it is not off
    ignored: bool = False
    # read and turned into our own key (the reason says which): not unsupported at all, but
    # kept here so the key is known, typed by its off value, and listed in the docs
    translated: bool = False


def group(keys: str, reason: str, off: tuple = (), **kw: bool) -> dict[str, Unsupported]:
    """The same entry for each of the space-separated ``keys``."""
    return {k: Unsupported(reason, off, **kw) for k in keys.split()}
