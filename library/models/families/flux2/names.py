"""The FLUX.2 transformer's weights between Black Forest Labs' names and diffusers' (spec.py).

Conversions only cut and join tensors (fp8-stored weights move bit for bit): a fused ``qkv``
weight is q, k and v stacked by rows, and the final adaLN's rows swap their two halves. Norm
weights are ``.scale`` in the original names, ``.weight`` in diffusers'.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import torch

from library.models.families.flux2 import spec


def module_table(transformer_keys: Iterable[str]) -> dict[str, tuple[str, ...]]:
    """Original module -> its diffusers modules (row order) for a transformer with these
    diffusers weight names."""
    blocks: dict[str, set[int]] = {}
    table: dict[str, tuple[str, ...]] = {}
    names = set(transformer_keys)
    for original, ours in spec.TOP.items():
        if f"{ours}.weight" in names:
            table[original] = (ours,)
    for key in names:
        head, _, rest = key.partition(".")
        if rest[:1].isdigit():
            blocks.setdefault(head, set()).add(int(rest.split(".", 1)[0]))
    for original_list, ours_list, layout in spec.BLOCKS:
        for i in sorted(blocks.get(ours_list, ())):
            for original, parts in layout.items():
                table[f"{original_list}.{i}.{original}"] = tuple(
                    f"{ours_list}.{i}.{p}" for p in parts
                )
    return table


def _param(name: str, original: str) -> str:
    """A parameter's suffix in the original names (norms hold ``scale``)."""
    return "scale" if name == "weight" and original.endswith("_norm") else name


def _swap(tensor: torch.Tensor) -> torch.Tensor:
    return torch.cat(tensor.chunk(2, dim=0)[::-1], dim=0)


def to_original(state: Mapping[str, torch.Tensor], prefix: str = "") -> dict[str, torch.Tensor]:
    """A diffusers Flux2Transformer2DModel state dict in Black Forest Labs' names (``prefix``
    before each); ValueError for a weight the table does not name."""
    out: dict[str, torch.Tensor] = {}
    done: set[str] = set()
    for original, parts in module_table(state).items():
        for param in ("weight", "bias"):
            keys = [f"{p}.{param}" for p in parts]
            if keys[0] not in state:
                continue
            tensor = torch.cat([state[k] for k in keys]) if len(keys) > 1 else state[keys[0]]
            out[f"{prefix}{original}.{_param(param, original)}"] = (
                _swap(tensor) if original in spec.SWAPPED else tensor
            )
            done.update(keys)
    left = sorted(set(state) - done)
    if left:
        raise ValueError(f"no FLUX.2 original name for {left[:3]}")
    return out


def to_diffusers(original: Mapping[str, torch.Tensor], prefix: str = "") -> dict[str, torch.Tensor]:
    """The inverse of ``to_original`` (keys without ``prefix`` are left out); ValueError for a
    weight the table does not name."""
    state = {k[len(prefix) :]: v for k, v in original.items() if k.startswith(prefix)}
    modules: dict[str, list[str]] = {}
    for key in state:
        module, _, param = key.rpartition(".")
        modules.setdefault(module, []).append(param)
    table = _original_table(modules)
    out: dict[str, torch.Tensor] = {}
    for module, params in modules.items():
        if module not in table:
            raise ValueError(f"{prefix}{module}.{params[0]} is no FLUX.2 transformer weight")
        parts = table[module]
        for param in params:
            tensor = state[f"{module}.{param}"]
            tensor = _swap(tensor) if module in spec.SWAPPED else tensor
            name = "weight" if param == "scale" else param
            pieces = tensor.chunk(len(parts), dim=0) if len(parts) > 1 else (tensor,)
            out.update({f"{p}.{name}": t for p, t in zip(parts, pieces, strict=True)})
    return out


def _original_table(modules: Iterable[str]) -> dict[str, tuple[str, ...]]:
    """Original module -> diffusers modules for the original modules present."""
    table = {k: (v,) for k, v in spec.TOP.items()}
    for module in modules:
        for original_list, ours_list, layout in spec.BLOCKS:
            head, _, rest = module.partition(".")
            index, _, inner = rest.partition(".")
            if head == original_list and index.isdigit() and inner in layout:
                table[module] = tuple(f"{ours_list}.{index}.{p}" for p in layout[inner])
    return table


def detect(keys: Iterable[str]) -> str | None:
    """The prefix of a FLUX.2 transformer in a file with these tensor names ("" or
    spec.CHECKPOINT_PREFIX), told from FLUX.1 by the shared modulation; None for another model."""
    names = set(keys)
    for prefix in ("", spec.CHECKPOINT_PREFIX):
        if f"{prefix}double_stream_modulation_img.lin.weight" in names:
            return prefix
    return None
