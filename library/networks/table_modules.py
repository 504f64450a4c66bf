"""kohya's modules of a transformer whose original names a family's name table gives
(library/models/families/name_table.py): every Linear of every entry of the table's numbered
lists, named by its original path (fused layers as one module over their diffusers parts, in
the order of the fused rows), as kohya's trainers and ComfyUI name them; and, for files that
name them too, the table's top-level Linears (``top_modules``)."""

from __future__ import annotations

from collections.abc import Iterable

from torch import nn

from library.networks.fused_keys import KohyaModule, kohya_module
from library.networks.kohya_names import unwrap


def table_modules(
    model: nn.Module, prefix: str, table, lists: Iterable[tuple[str, str]] | None = None
) -> list[KohyaModule]:
    """kohya's modules (``prefix`` + original path) of each entry of the numbered ``lists``
    ((original list, diffusers list); None: every list of the table) of ``model``, in order:
    the Linears ``table.linears`` names for the list. Works on a model on the meta device and
    on one given adapters."""
    model = unwrap(model)
    if lists is None:
        lists = [(original, diffusers) for original, diffusers, _stems in table.lists]
    modules = []
    for original, diffusers in lists:
        for index in range(len(model.get_submodule(diffusers))):
            for stem, parts in table.linears(original):
                paths = (f"{diffusers}.{index}.{part}" for part in parts)
                modules.append(kohya_module(model, prefix, f"{original}.{index}.{stem}", paths))
    return modules


def top_modules(model: nn.Module, prefix: str, table) -> list[KohyaModule]:
    """kohya's modules of the table's top-level Linears that ``model`` has (a model without a
    guidance embedder has none of its Linears), in the table's order; an original whose two
    halves the table swaps is marked so."""
    model = unwrap(model)
    present = {name for name, _ in model.named_modules()}
    return [
        kohya_module(model, prefix, old, parts, swapped_halves=f"{old}.weight" in table.swapped)
        for old, parts in table.linears(None)
        if all(part in present for part in parts)
    ]
