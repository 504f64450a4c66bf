"""Z-Image LoRA files: per-Linear (down, up, alpha) to the file's tensors and back.

difftune writes, for each adapted diffusers Linear ``<path>`` (library/models/families/zimage/
lora_keys.py has why these names):

    diffusion_model.<path>.lora_down.weight   [r, in]   the adapter's dtype
    diffusion_model.<path>.lora_up.weight     [out, r]
    diffusion_model.<path>.alpha              0-d float32; the scale is alpha / r

ComfyUI and diffusers both read this as it is, with alpha / r as the scale. The kohya names
(lora_down/lora_up) rather than peft's (lora_A/lora_B) keep the alpha with them: every reader
of kohya names looks for ``.alpha``, while some peft readers (ai-toolkit) drop it.

:func:`read_lora` reads difftune's files and those of musubi-tuner (``lora_unet_`` names, an
alpha per module), ai-toolkit (``diffusion_model.`` with lora_A/lora_B and no alpha: scale 1),
diffusers' ``save_lora_weights`` (``transformer.`` with lora_A/lora_B; alpha from the file's
``lora_adapter_metadata`` when it has one, else scale 1) and kohya's original names with a fused
qkv (split into to_q, to_k and to_v).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping

import torch
from torch import nn

from library.errors import CheckpointError
from library.models.families.zimage import lora_keys
from library.networks.fused_keys import LoraWeights
from library.networks.kohya_names import ALPHA, DOWN, UP, unwrap

PEFT_DOWN, PEFT_UP = "lora_A.weight", "lora_B.weight"
# file suffix -> the part of a LoRA module it holds
_KINDS = {DOWN: "down", PEFT_DOWN: "down", UP: "up", PEFT_UP: "up", ALPHA: "alpha"}
PEFT_METADATA = "lora_adapter_metadata"  # diffusers' LORA_ADAPTER_METADATA_KEY


def write_lora(weights: Mapping[str, LoraWeights]) -> dict[str, torch.Tensor]:
    """The file tensors of per-diffusers-Linear LoRA weights ``{path: (down, up, alpha)}``.

    Weights keep their dtype (detached, contiguous copies); alpha becomes a 0-d float32 tensor.
    A pair that is not [r, in] / [out, r] is a ValueError naming its path.
    """
    tensors: dict[str, torch.Tensor] = {}
    for path in sorted(weights):
        down, up, alpha = weights[path]
        if down.dim() != 2 or up.dim() != 2 or up.shape[1] != down.shape[0]:
            raise ValueError(
                f"{path}: down {list(down.shape)} and up {list(up.shape)} are not a LoRA pair"
            )
        name = lora_keys.written_name(path)
        tensors[f"{name}.{DOWN}"] = down.detach().contiguous().clone()
        tensors[f"{name}.{UP}"] = up.detach().contiguous().clone()
        tensors[f"{name}.{ALPHA}"] = torch.tensor(float(alpha), dtype=torch.float32)
    return tensors


def read_lora(
    tensors: Mapping[str, torch.Tensor],
    transformer: nn.Module,
    *,
    metadata: Mapping[str, str] | None = None,
    source: str = "LoRA file",
) -> dict[str, LoraWeights]:
    """``{diffusers Linear path: (down, up, alpha)}`` of a Z-Image LoRA file's tensors.

    Any layout the module docstring names; a module without alpha (and no diffusers metadata)
    has alpha = rank, scale 1, as every tool reading such files assumes. A fused qkv module is
    split: into its blocks when its up weight is block-diagonal with equal ranks (each keeping
    the fused scale), else each part takes the whole down and its rows of up. Tensors keep the
    file's dtype. CheckpointError naming ``source`` and the key for a key that is not a LoRA
    tensor, names no Linear of ``transformer``, lacks its down or up, does not fit the layer,
    or adapts a Linear another module of the file adapts too.
    """
    transformer = unwrap(transformer)
    table = lora_keys.file_modules(transformer)
    groups: dict[str, dict[str, torch.Tensor]] = {}
    for key, tensor in tensors.items():
        if key.endswith(".dora_scale"):
            raise CheckpointError(f"{source}: {key!r} is a DoRA tensor; difftune's LoRA has none")
        name, suffix = lora_keys.split_key(key, tuple(_KINDS), source)
        if name not in table:
            raise lora_keys.unknown_module(key, name, source)
        kind = _KINDS[suffix]
        if kind in groups.setdefault(name, {}):
            raise CheckpointError(f"{source}: {name} has two {kind} tensors ({key!r} is one)")
        groups[name][kind] = tensor
    peft_alpha = _peft_alphas(metadata, source)
    layers = dict(transformer.named_modules())
    weights: dict[str, LoraWeights] = {}
    adapted_by: dict[str, str] = {}
    for name in sorted(groups):
        parts = table[name]
        down, up = _pair(name, groups[name], parts, layers, source)
        alpha = groups[name].get("alpha")
        if alpha is not None:
            alpha = float(alpha.float().item())
        elif name.startswith(lora_keys.PEFT_PREFIX) and peft_alpha is not None:
            alpha = peft_alpha(parts[0], down.shape[0])
        else:
            alpha = float(down.shape[0])
        for path, part in _split(parts, down, up, alpha).items():
            if path in adapted_by:
                raise CheckpointError(
                    f"{source}: {adapted_by[path]} and {name} both adapt {path}; the file holds "
                    "two LoRAs for one layer"
                )
            adapted_by[path] = name
            weights[path] = part
    return weights


def _pair(
    name: str,
    group: Mapping[str, torch.Tensor],
    parts: tuple[str, ...],
    layers: Mapping[str, nn.Module],
    source: str,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(down, up) of one file module, checked against the Linears it stands for."""
    for kind in ("down", "up"):
        if kind not in group:
            raise CheckpointError(f"{source}: {name} has no {kind} weight")
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
    rows = up.shape[0] // len(parts)  # q, k and v are equally wide (n_kv_heads = n_heads)
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


def _peft_alphas(metadata: Mapping[str, str] | None, source: str):
    """A function (path, rank) -> alpha from diffusers' ``lora_adapter_metadata`` (the peft
    LoraConfig of the transformer, keys prefixed ``transformer.``), or None without one."""
    if not metadata or PEFT_METADATA not in metadata:
        return None
    config = json.loads(metadata[PEFT_METADATA])
    prefix = lora_keys.PEFT_PREFIX
    if config.get(prefix + "use_dora"):
        raise CheckpointError(f"{source}: a DoRA adapter (use_dora); difftune's LoRA has none")
    default = config.get(prefix + "lora_alpha")
    patterns = config.get(prefix + "alpha_pattern") or {}
    rslora = bool(config.get(prefix + "use_rslora"))

    def alpha(path: str, rank: int) -> float:
        # peft matches a pattern against the end of the module path, at a dot boundary
        found = next((v for k, v in patterns.items() if re.fullmatch(rf"(.*\.)?({k})", path)), None)
        value = float(found if found is not None else default if default is not None else rank)
        # rsLoRA scales by lora_alpha / sqrt(r); kohya's alpha / r needs alpha = lora_alpha sqrt(r)
        return value * math.sqrt(rank) if rslora else value

    return alpha
