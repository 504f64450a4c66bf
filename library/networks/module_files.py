"""Adapter files composed from a key map's modules and the kinds' per-module tensors.

A key map (library/networks/key_maps.py, chosen by the family) lists file modules, each naming
the model layers it stands for; the registered kinds (library/networks/kinds.py) say, for the
layers they adapt, which tensors a module holds. Writing asks each module's kind for its tensors
and stores them as ``<module name>.<suffix>``; every adapted layer must be covered by a module.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn

from library.networks.kind_base import AdapterKind, FileModule
from library.networks.kinds import adapter_kinds


def file_layers(model: nn.Module) -> list[tuple[AdapterKind, dict[str, nn.Module]]]:
    """(kind, model layer path -> its adapter) for every kind that adapts ``model``."""
    found = []
    for kind in adapter_kinds():
        layers = kind.file_layers(model)
        if layers:
            found.append((kind, layers))
    return found


def adapted_paths(model: nn.Module) -> list[str]:
    """The model layer paths any kind adapts, in module order."""
    paths = {path for _, layers in file_layers(model) for path in layers}
    return [path for path, _ in model.named_modules() if path in paths]


def adapted_modules(model: nn.Module, modules: Iterable[FileModule]) -> list[FileModule]:
    """The modules of ``modules`` whose layers carry adapters (ValueError for a module only some
    of whose layers do)."""
    kinds = file_layers(model)
    return [m for m in modules if any(k.module_layer(layers, m) is not None for k, layers in kinds)]


def write_modules(model: nn.Module, modules: Iterable[FileModule]) -> dict[str, torch.Tensor]:
    """The file tensors of ``model``'s adapters under the names of ``modules`` (the modules
    whose layers carry no adapter are left out); ValueError for an adapted layer no module
    covers."""
    modules = list(modules)
    kinds = file_layers(model)
    covered = {path for module in modules for path in module.parts}
    unknown = sorted({path for _, layers in kinds for path in layers} - covered)
    if unknown:
        raise ValueError(f"{len(unknown)} adapted layers have no kohya name, e.g. {unknown[0]}")
    tensors: dict[str, torch.Tensor] = {}
    for module in modules:
        for kind, layers in kinds:
            found = kind.module_tensors(layers, module)
            if found is not None:
                for suffix, tensor in found.items():
                    tensors[f"{module.name}.{suffix}"] = tensor
                break
    return tensors
