"""Each family's test kit and tiny models, kept out of library/ (nothing there imports tests).

``tests/kits/<family name>/`` holds ``kit.py`` (``KIT``, the family's ConformanceKit of
conformance_kit.py, which enters it in the conformance and distributed suites) and the tiny
models it is built from (``tiny.py``, ``tiny_files.py``, ``tiny_tokenizer.py``,
``tiny_shapes.py`` as the family needs). A family without a kit folder is left out of those
suites, which say so. ``toy/`` is a made-up family's whole package (spec, family class, entry,
tiny models), registered only by its own tests: docs/design.md's "Adding a family" example.
``videos.py`` is no family: it encodes the tiny test videos (every container, and broken,
rotated and variable-rate ones) that the data path's tests read.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

_EXTRA: dict[str, Any] = {}


def kit_of(name: str) -> Any | None:
    """The ConformanceKit of the family ``name`` (``tests.kits.<name>.kit:KIT``); None when the
    family has no kit. A kit that fails to import raises."""
    if name in _EXTRA:
        return _EXTRA[name]
    module_name = f"{__name__}.{name}.kit"
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as err:
        if err.name in (module_name, f"{__name__}.{name}"):
            return None
        raise
    return getattr(module, "KIT", None)


@contextmanager
def registered_kit(name: str, kit: Any) -> Iterator[Any]:
    """For tests of the suites: ``kit`` is the family ``name``'s kit inside the block (a made-up
    family registered with library.models.families.registry.registered)."""
    _EXTRA[name] = kit
    try:
        yield kit
    finally:
        del _EXTRA[name]
