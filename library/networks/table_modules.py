"""kohya's modules of a transformer whose original names a family's name table gives
(library/models/families/name_table.py): every Linear of every entry of the table's numbered
lists, named by its original path (fused layers as one module over their diffusers parts, in
the order of the fused rows), as kohya's trainers and ComfyUI name them."""

from __future__ import annotations

from collections.abc import Iterable

from torch import nn

from library.networks.fused_keys import KohyaModule, kohya_module
from library.networks.kohya_names import unwrap


def table_modules(
    model: nn.Module, prefix: str, table, lists: Iterable[tuple[str, str]]
) -> list[KohyaModule]:
    """kohya's modules (``prefix`` + original path) of each entry of the numbered ``lists``
    ((original list, diffusers list)) of ``model``, in order: the Linears ``table.linears``
    names for the list. Works on a model on the meta device and on one given adapters."""
    model = unwrap(model)
    modules = []
    for original, diffusers in lists:
        for index in range(len(model.get_submodule(diffusers))):
            for stem, parts in table.linears(original):
                paths = (f"{diffusers}.{index}.{part}" for part in parts)
                modules.append(kohya_module(model, prefix, f"{original}.{index}.{stem}", paths))
    return modules
