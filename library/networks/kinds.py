"""The registry of adapter kinds: which kind a network_module selects, and which kinds a model
carries. LoRA (library/networks/lora_kind.py) is the default kind; LyCORIS
(library/networks/lycoris_kind.py) is selected by ``lycoris.kohya``.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager

from torch import nn

from library.networks.kind_base import AdapterKind
from library.networks.lora_kind import LORA
from library.networks.lycoris_kind import LYCORIS

_KINDS: list[AdapterKind] = []


def _builtins() -> list[AdapterKind]:
    if not _KINDS:
        # imported on first use: the built-in kinds read the key tables, which ask this registry

        _KINDS.extend((LORA, LYCORIS))
    return _KINDS


def adapter_kinds() -> tuple[AdapterKind, ...]:
    """Every registered kind; the first is the default (LoRA)."""
    return tuple(_builtins())


def kind_named(name: str) -> AdapterKind:
    """The kind called ``name``; KeyError naming the known ones otherwise."""
    for kind in adapter_kinds():
        if kind.name == name:
            return kind
    known = ", ".join(kind.name for kind in adapter_kinds())
    raise KeyError(f"no adapter kind {name!r} (known: {known})")


def kind_for(network_module: str | None) -> AdapterKind:
    """The kind ``network_module`` selects: the kind that names it, else the default."""
    for kind in adapter_kinds():
        if network_module in kind.network_modules:
            return kind
    return adapter_kinds()[0]


def kind_in(models: Iterable[nn.Module]) -> AdapterKind:
    """The kind whose adapters ``models`` carry (the default when they carry none)."""
    models = list(models)
    for kind in adapter_kinds():
        if any(kind.layers(model) for model in models):
            return kind
    return adapter_kinds()[0]


@contextmanager
def registered(kind: AdapterKind) -> Iterator[AdapterKind]:
    """``kind`` in the registry for the length of a ``with`` block (tests)."""
    _builtins().append(kind)
    try:
        yield kind
    finally:
        _KINDS.remove(kind)
