"""Z-Image LyCORIS files: the module names of library/models/families/zimage/lora_keys.py with
LyCORIS' tensor names.

A LyCORIS module is stored as ``<name>.<suffix>`` with LyCORIS' suffixes (``hada_w1_a``, ...,
``lokr_w1``, ..., ``lora_down.weight``, ``alpha``, ``dora_scale``), under the same module names
as a LoRA: difftune writes ``diffusion_model.<diffusers path>``, one module per diffusers
Linear. ComfyUI reads LoHa and LoKr modules under exactly those names (``comfy/lora.py``
``load_lora`` / ``comfy/weight_adapter``) and applies a to_q/to_k/to_v module to its rows of
the original fused qkv weight, so no q, k, v fusing is needed: the adapters themselves are the
shared ``library.networks.lycoris`` layers, one per Linear.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import nn

from library.errors import CheckpointError
from library.models.families.zimage import lora_keys
from library.networks.kohya_names import unwrap
from library.networks.lycoris.file_math import LOCON_KEYS, LOHA_KEYS, LOKR_KEYS, SHARED_KEYS

SUFFIXES = LOCON_KEYS + LOHA_KEYS + LOKR_KEYS + SHARED_KEYS


def write_lycoris(modules: Mapping[str, Mapping[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """The file tensors of per-diffusers-Linear LyCORIS tensors ``{path: {suffix: tensor}}``
    (e.g. a LycorisLayer's ``file_tensors()``); a suffix LyCORIS does not write is a
    ValueError naming it."""
    tensors: dict[str, torch.Tensor] = {}
    for path in sorted(modules):
        for suffix, tensor in modules[path].items():
            if suffix not in SUFFIXES:
                raise ValueError(f"{path}: {suffix!r} is not a LyCORIS tensor name")
            tensors[f"{lora_keys.written_name(path)}.{suffix}"] = tensor
    return tensors


def read_lycoris(
    tensors: Mapping[str, torch.Tensor], transformer: nn.Module, source: str = "LyCORIS file"
) -> dict[str, dict[str, torch.Tensor]]:
    """``{diffusers Linear path: {suffix: tensor}}`` of a Z-Image LyCORIS file.

    Reads every module name of lora_keys.file_modules except the fused qkv ones: a LoHa or LoKr
    of the fused weight is one change over all its rows, which separate q, k, v adapters cannot
    hold exactly. CheckpointError naming ``source`` and the key for a tensor LyCORIS does not
    write, a module that names no Linear of ``transformer`` or a fused module, or one Linear
    named by two modules. The tensors' shapes are the adapter's to check (LycorisLayer).
    """
    table = lora_keys.file_modules(unwrap(transformer))
    modules: dict[str, dict[str, torch.Tensor]] = {}
    named_by: dict[str, str] = {}
    for key, tensor in tensors.items():
        name, suffix = lora_keys.split_key(key, SUFFIXES, source)
        if name not in table:
            raise lora_keys.unknown_module(key, name, source)
        parts = table[name]
        if len(parts) > 1:
            raise CheckpointError(
                f"{source}: {key!r} adapts the fused {name} ({', '.join(parts)}) as one LyCORIS "
                "module, which difftune's per-Linear adapters cannot hold; use a file with "
                "separate to_q, to_k and to_v modules"
            )
        path = parts[0]
        if named_by.setdefault(path, name) != name:
            raise CheckpointError(f"{source}: {named_by[path]} and {name} both adapt {path}")
        modules.setdefault(path, {})[suffix] = tensor
    return modules
