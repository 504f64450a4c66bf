"""Adapter files of transformers whose adapters sit on single Linears, read in every tool's names.

difftune writes one module per adapted diffusers Linear, ``<written name>.<tensor>`` (kohya's
LoRA tensors or LyCORIS' by the kind); other tools name the same Linears otherwise (musubi-
tuner's ``lora_unet_<path with _>``, diffusers' peft ``transformer.<path>`` with lora_A/lora_B,
SimpleTuner's ``lycoris_<path with _>``, kohya's original names, where one original module may
stand for several Linears, such as a fused qkv). A family lists those names in a
:class:`LinearNames` (file module name -> the diffusers Linear paths it stands for, in row
order); this module reads any of them:

- LoRA (:func:`read_lora`): a module without alpha has alpha = rank (scale 1), as every tool
  reading such files assumes, except peft files whose ``lora_adapter_metadata`` header gives
  lora_alpha (and rsLoRA's sqrt(r) scale); a fused module is split into its Linears, by blocks
  when its up weight is block-diagonal with equal ranks (each keeping the fused scale), else
  each part takes the whole down and its rows of up.
- LyCORIS (:func:`read_lycoris`): LyCORIS' tensor names under any name of a single Linear; a
  LoHa or LoKr of a fused module is one change over all its rows, which per-Linear adapters
  cannot hold, so it is refused by name.

Tensors keep the file's dtype. Every problem is a CheckpointError naming the file and the key.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

import torch
from torch import nn

from library.errors import CheckpointError
from library.networks.fused_keys import LoraWeights, load_adapter_weights
from library.networks.kohya_names import ALPHA, DOWN, UP, unwrap
from library.networks.lycoris.file_math import LOCON_KEYS, LOHA_KEYS, LOKR_KEYS, SHARED_KEYS
from library.networks.peft_metadata import peft_configs

PEFT_DOWN, PEFT_UP = "lora_A.weight", "lora_B.weight"
# file suffix -> the part of a LoRA module it holds
_LORA_PARTS = {DOWN: "down", PEFT_DOWN: "down", UP: "up", PEFT_UP: "up", ALPHA: "alpha"}
LYCORIS_SUFFIXES = LOCON_KEYS + LOHA_KEYS + LOKR_KEYS + SHARED_KEYS


@dataclass(frozen=True)
class LinearNames:
    """How one family's adapter files name its transformer's Linears.

    ``table(transformer)``: every file module name any tool writes -> the diffusers Linear
    paths it stands for (one, or a fused module's parts in row order). ``written(path)``: the
    name difftune writes. ``peft_prefix``: diffusers' save_lora_weights prefix (whose alpha
    comes from the peft header). ``family`` and ``examples`` (module names as files spell them)
    are for messages."""

    family: str
    table: Callable[[nn.Module], dict[str, tuple[str, ...]]]
    written: Callable[[str], str]
    peft_prefix: str
    examples: str

    def split_key(self, key: str, suffixes, source: str) -> tuple[str, str]:
        """(module name, suffix) of a file key ``<name>.<suffix>`` whose suffix is one of
        ``suffixes`` (the longest that fits); CheckpointError naming the key otherwise."""
        for suffix in sorted(suffixes, key=len, reverse=True):
            if key.endswith("." + suffix):
                return key[: -len(suffix) - 1], suffix
        raise CheckpointError(
            f"{source}: {key!r} is not an adapter tensor difftune reads for {self.family} (its "
            f"name ends in none of {', '.join(suffixes)})"
        )

    def unknown(self, key: str, name: str, source: str) -> CheckpointError:
        """The error for a file key whose module names no Linear of the transformer."""
        return CheckpointError(
            f"{source}: {key!r} names {name!r}, which is no Linear of the {self.family} "
            f"transformer; the file was made for another model ({self.family} modules are "
            f"named like {self.examples})"
        )


def fold_into_peft(tensors: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A file's kohya LoRA modules (lora_down, lora_up, alpha) in peft's tensor names with the
    scale alpha / r folded into lora_B, for layouts whose readers take no alpha (they apply
    B A at scale 1); other modules (LyCORIS') as they are."""
    out: dict[str, torch.Tensor] = {}
    for module in dict.fromkeys(map(_module_of, tensors)):
        parts = {k[len(module) + 1 :]: v for k, v in tensors.items() if _module_of(k) == module}
        if set(parts) != {DOWN, UP, ALPHA}:
            out.update({f"{module}.{k}": v for k, v in parts.items()})
            continue
        down, up = parts[DOWN], parts[UP]
        out[f"{module}.{PEFT_DOWN}"] = down
        out[f"{module}.{PEFT_UP}"] = (up.float() * (float(parts[ALPHA]) / down.shape[0])).to(
            up.dtype
        )
    return out


def unfold_peft(tensors: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """peft's lora_A / lora_B of a file as kohya's lora_down / lora_up with alpha = rank (the
    scale 1 such a module has); other tensors as they are."""
    out: dict[str, torch.Tensor] = {}
    for key, value in tensors.items():
        if key.endswith("." + PEFT_DOWN):
            module = key[: -len(PEFT_DOWN) - 1]
            out[f"{module}.{DOWN}"] = value
            out[f"{module}.{ALPHA}"] = torch.tensor(float(value.shape[0]))
        elif key.endswith("." + PEFT_UP):
            out[key[: -len(PEFT_UP)] + UP] = value
        else:
            out[key] = value
    return out


def _module_of(key: str) -> str:
    """The module name of an adapter file key (its tensor name is one part, or two ending in
    ``weight``)."""
    module, last = key.rsplit(".", 1)
    return module.rsplit(".", 1)[0] if last == "weight" else module


# --- LoRA ---------------------------------------------------------------------------------------


def write_lora(weights: Mapping[str, LoraWeights], names: LinearNames) -> dict[str, torch.Tensor]:
    """The file tensors of per-Linear LoRA weights ``{path: (down, up, alpha)}`` under the
    names difftune writes: weights detached, contiguous copies in their dtype, alpha a 0-d
    float32 tensor. A pair that is not [r, in] / [out, r] is a ValueError naming its path."""
    tensors: dict[str, torch.Tensor] = {}
    for path in sorted(weights):
        down, up, alpha = weights[path]
        if down.dim() != 2 or up.dim() != 2 or up.shape[1] != down.shape[0]:
            raise ValueError(
                f"{path}: down {list(down.shape)} and up {list(up.shape)} are not a LoRA pair"
            )
        name = names.written(path)
        tensors[f"{name}.{DOWN}"] = down.detach().contiguous().clone()
        tensors[f"{name}.{UP}"] = up.detach().contiguous().clone()
        tensors[f"{name}.{ALPHA}"] = torch.tensor(float(alpha), dtype=torch.float32)
    return tensors


def read_lora(
    tensors: Mapping[str, torch.Tensor],
    transformer: nn.Module,
    names: LinearNames,
    *,
    metadata: Mapping[str, str] | None = None,
    source: str = "LoRA file",
) -> dict[str, LoraWeights]:
    """``{diffusers Linear path: (down, up, alpha)}`` of a LoRA file's tensors in any of the
    family's names (the module docstring has the alpha and fused-module rules). CheckpointError
    naming ``source`` and the key for a key that is not a LoRA tensor, names no Linear of
    ``transformer``, lacks its down or up, does not fit the layer, or adapts a Linear another
    module of the file adapts too."""
    transformer = unwrap(transformer)
    table = names.table(transformer)
    groups: dict[str, dict[str, torch.Tensor]] = {}
    for key, tensor in tensors.items():
        if key.endswith(".dora_scale"):
            raise CheckpointError(f"{source}: {key!r} is a DoRA tensor; difftune's LoRA has none")
        name, suffix = names.split_key(key, tuple(_LORA_PARTS), source)
        if name not in table:
            raise names.unknown(key, name, source)
        part = _LORA_PARTS[suffix]
        if part in groups.setdefault(name, {}):
            raise CheckpointError(f"{source}: {name} has two {part} tensors ({key!r} is one)")
        groups[name][part] = tensor
    peft_alpha = _peft_alphas(metadata, names.peft_prefix, source)
    layers = dict(transformer.named_modules())
    weights: dict[str, LoraWeights] = {}
    adapted_by: dict[str, str] = {}
    for name in sorted(groups):
        parts = table[name]
        down, up = _pair(name, groups[name], parts, layers, source)
        alpha = groups[name].get("alpha")
        if alpha is not None:
            alpha = float(alpha.float().item())
        elif name.startswith(names.peft_prefix) and peft_alpha is not None:
            alpha = peft_alpha(parts[0], down.shape[0])
        else:
            alpha = float(down.shape[0])
        for path, weight in _split(parts, down, up, alpha).items():
            if path in adapted_by:
                raise CheckpointError(
                    f"{source}: {adapted_by[path]} and {name} both adapt {path}; the file holds "
                    "two LoRAs for one layer"
                )
            adapted_by[path] = name
            weights[path] = weight
    return weights


def _pair(
    name: str,
    group: Mapping[str, torch.Tensor],
    parts: tuple[str, ...],
    layers: Mapping[str, nn.Module],
    source: str,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(down, up) of one file module, checked against the Linears it stands for."""
    for part in ("down", "up"):
        if part not in group:
            raise CheckpointError(f"{source}: {name} has no {part} weight")
    down, up = group["down"], group["up"]
    bases = [getattr(layers[p], "base_layer", layers[p]) for p in parts]
    in_features = bases[0].in_features
    out_features = sum(base.out_features for base in bases)
    rank = down.shape[0] if down.dim() == 2 else -1
    if down.dim() != 2 or down.shape[1] != in_features or tuple(up.shape) != (out_features, rank):
        raise CheckpointError(
            f"{source}: {name} has down {list(down.shape)} / up {list(up.shape)}, the layer "
            f"needs [r, {in_features}] / [{out_features}, r]; the file was made for another model"
        )
    return down, up


def _split(
    parts: tuple[str, ...], down: torch.Tensor, up: torch.Tensor, alpha: float
) -> dict[str, LoraWeights]:
    """Per-part (down, up, alpha) of one file module (the module docstring of fused_keys.py
    explains the block-diagonal layout; kohya and musubi-tuner write fused qkv that way)."""
    if len(parts) == 1:
        return {parts[0]: (down, up, alpha)}
    rows = up.shape[0] // len(parts)  # the fused parts are equally wide
    count, total_rank = len(parts), down.shape[0]
    rank = total_rank // count
    blocks = [up[i * rows : (i + 1) * rows] for i in range(count)]
    diagonal = total_rank % count == 0 and all(
        not block[:, : i * rank].any() and not block[:, (i + 1) * rank :].any()
        for i, block in enumerate(blocks)
    )
    if diagonal:
        # each block keeps the fused scale alpha / (n r), so its own alpha is alpha / n
        return {
            path: (
                down[i * rank : (i + 1) * rank].contiguous(),
                blocks[i][:, i * rank : (i + 1) * rank].contiguous(),
                alpha / count,
            )
            for i, path in enumerate(parts)
        }
    return {path: (down, blocks[i].contiguous(), alpha) for i, path in enumerate(parts)}


def _peft_alphas(metadata: Mapping[str, str] | None, prefix: str, source: str):
    """A function (path, rank) -> alpha from diffusers' ``lora_adapter_metadata`` header (the
    peft LoraConfig of the component ``prefix`` names), or None without one."""
    config = peft_configs(metadata, source).get(prefix.rstrip("."))
    if config is None:
        return None
    if config.use_dora:
        raise CheckpointError(f"{source}: a DoRA adapter (use_dora); difftune's LoRA has none")
    return config.alpha


# --- LyCORIS ------------------------------------------------------------------------------------


def write_lycoris(
    modules: Mapping[str, Mapping[str, torch.Tensor]], names: LinearNames
) -> dict[str, torch.Tensor]:
    """The file tensors of per-Linear LyCORIS tensors ``{path: {suffix: tensor}}`` (e.g. a
    LycorisLayer's ``file_tensors()``) under the names difftune writes; a suffix LyCORIS does
    not write is a ValueError naming it."""
    tensors: dict[str, torch.Tensor] = {}
    for path in sorted(modules):
        for suffix, tensor in modules[path].items():
            if suffix not in LYCORIS_SUFFIXES:
                raise ValueError(f"{path}: {suffix!r} is not a LyCORIS tensor name")
            tensors[f"{names.written(path)}.{suffix}"] = tensor
    return tensors


def read_lycoris(
    tensors: Mapping[str, torch.Tensor],
    transformer: nn.Module,
    names: LinearNames,
    source: str = "LyCORIS file",
) -> dict[str, dict[str, torch.Tensor]]:
    """``{diffusers Linear path: {suffix: tensor}}`` of a LyCORIS file in any of the family's
    names but fused ones. CheckpointError naming ``source`` and the key for a tensor LyCORIS
    does not write, a module that names no Linear of ``transformer`` or a fused module, or one
    Linear named by two modules. The tensors' shapes are the adapter's to check."""
    table = names.table(unwrap(transformer))
    modules: dict[str, dict[str, torch.Tensor]] = {}
    named_by: dict[str, str] = {}
    for key, tensor in tensors.items():
        name, suffix = names.split_key(key, LYCORIS_SUFFIXES, source)
        if name not in table:
            raise names.unknown(key, name, source)
        parts = table[name]
        if len(parts) > 1:
            raise CheckpointError(
                f"{source}: {key!r} adapts the fused {name} ({', '.join(parts)}) as one LyCORIS "
                "module, which difftune's per-Linear adapters cannot hold; use a file with "
                "a module per Linear"
            )
        path = parts[0]
        if named_by.setdefault(path, name) != name:
            raise CheckpointError(f"{source}: {named_by[path]} and {name} both adapt {path}")
        modules.setdefault(path, {})[suffix] = tensor
    return modules


# --- into the adapters --------------------------------------------------------------------------


def load_file_tensors(
    kind, transformer: nn.Module, tensors: Mapping[str, torch.Tensor], names: LinearNames,
    source: str, metadata: Mapping[str, str] | None = None,
) -> None:  # fmt: skip
    """Load a file's tensors, in any of the family's names, into the ``kind`` adapters of
    ``transformer`` (LoRA or LyCORIS); ``metadata``: the file's header (a peft file's alpha).
    CheckpointError naming ``source`` otherwise."""
    if kind.name == "lora":
        weights = read_lora(tensors, transformer, names, metadata=metadata, source=source)
        load_adapter_weights(transformer, weights, source)
        return
    if kind.name != "lycoris":
        raise CheckpointError(f"{source}: {names.family} files hold no {kind.name} adapters")
    layers = kind.layers(transformer)
    modules = read_lycoris(tensors, transformer, names, source)
    if set(modules) != set(layers):
        extra = sorted(set(modules) ^ set(layers))
        raise CheckpointError(
            f"{source}: its LyCORIS modules are not this preset's ({extra[0]} is in one "
            "only); check network_args preset"
        )
    kind.load_modules(layers, modules, source)
