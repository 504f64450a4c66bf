"""diffusers' (peft) and ComfyUI's layouts -> kohya's (layouts.py describes the three).

diffusers' per-Linear parts of a fused module are joined again: exactly as they were written
when the header entry ``difftune.kohya_modules`` (from_kohya.py) still fits them, else from
their own ranks and alphas.
"""

from __future__ import annotations

import json
from collections.abc import Mapping

import torch

from library.errors import CheckpointError
from library.lora_tools.base_model import Layer, family_label
from library.lora_tools.comfyui_keys import comfy_names
from library.lora_tools.common import ALPHA, DOWN, UP
from library.lora_tools.layouts import (
    KOHYA_HEADER,
    LORA_A,
    LORA_B,
    detect_layout,
    diffusers_names,
    split_keys,
    without_layout_headers,
)
from library.networks.peft_metadata import PeftConfig, peft_configs


def to_kohya(
    tensors, metadata, components, table: Mapping[str, Layer], source, unknown: list | None = None
):
    """A diffusers- or ComfyUI-layout file in kohya's layout, for the model ``components``
    whose ``layer_table`` is ``table``; a kohya file as it is. Keys that name no layer of the
    model are a CheckpointError, or with an ``unknown`` list are appended to it and left out."""
    layout = detect_layout(tensors, source)
    if layout == "comfyui":
        return comfy_to_kohya(tensors, metadata, table, components, source, unknown)
    if layout == "diffusers":
        return diffusers_to_kohya(tensors, metadata, table, components, source, unknown)
    return dict(tensors), dict(metadata)


def _split_names(keys, names: Mapping[str, str], source, components, unknown_out=None):
    """{kohya name: {suffix: key}} for keys ``<layout name>.<suffix>``, the layout names being
    ``names``' keys (they may contain dots); keys of no known name are a CheckpointError, or
    appended to ``unknown_out`` when it is a list."""
    found, unknown = split_keys(keys, names)
    groups: dict[str, dict[str, str]] = {}
    for prefix, by_suffix in found.items():
        groups.setdefault(names[prefix], {}).update(by_suffix)
    if unknown and unknown_out is not None:
        unknown_out.extend(unknown)
    elif unknown:
        raise CheckpointError(
            f"{source}: {len(unknown)} keys name no layer of this "
            f"{family_label(components.family)} model, e.g. {sorted(unknown)[0]}; the file is for "
            "another model"
        )
    return groups


def comfy_to_kohya(tensors, metadata, table, components, source, unknown=None):
    """ComfyUI's names -> kohya's; a module in peft's tensor names (lora_A / lora_B, which
    ComfyUI's loader reads too) becomes lora_down / lora_up with alpha = rank, the scale 1 such
    a module has there, unless it carries an alpha."""
    groups = _split_names(tensors, comfy_names(table, components), source, components, unknown)
    out = {}
    for name, keys in groups.items():
        parts = {suffix: tensors[key] for suffix, key in keys.items()}
        if LORA_A in parts and LORA_B in parts:
            down, up = parts.pop(LORA_A), parts.pop(LORA_B)
            alpha = parts.pop(ALPHA, torch.tensor(float(down.shape[0])))
            parts = {DOWN: down, UP: up, ALPHA: alpha, **parts}
        out.update({f"{name}.{suffix}": value for suffix, value in parts.items()})
    return out, dict(metadata)


def diffusers_to_kohya(tensors, metadata, table, components, source, unknown=None):
    """diffusers' per-Linear peft keys -> kohya modules (fused parts joined again)."""
    names = diffusers_names(table, components)
    lookup = {key: key for key in names}
    groups = _split_names(tensors, lookup, source, components, unknown)
    configs = peft_configs(metadata, source)
    try:
        record = json.loads(metadata.get(KOHYA_HEADER, "{}"))
    except ValueError:
        record = {}
    per_module: dict[str, dict[int, tuple]] = {}
    for key_name, keys in groups.items():
        extra = sorted(set(keys) - {LORA_A, LORA_B, ALPHA})
        if extra or LORA_A not in keys or LORA_B not in keys:
            what = f"{key_name}.{extra[0]}" if extra else f"{key_name} without lora_A/lora_B"
            raise CheckpointError(f"{source}: {what}: not a diffusers/peft LoRA tensor pair")
        name, index = names[key_name]
        lora_a, lora_b = tensors[keys[LORA_A]], tensors[keys[LORA_B]]
        component, _, path = key_name.partition(".")
        rank = int(lora_a.shape[0])
        if ALPHA in keys:
            alpha = float(tensors[keys[ALPHA]].float().item())
        else:
            alpha = configs.get(component, PeftConfig()).alpha(path, rank)
        per_module.setdefault(name, {})[index] = (lora_a, lora_b, alpha)
    out: dict[str, torch.Tensor] = {}
    for name in sorted(per_module):
        down, up, alpha = _join_module(table[name], per_module[name], record.get(name))
        out[f"{name}.{DOWN}"] = down
        out[f"{name}.{UP}"] = up
        if alpha is not None:
            out[f"{name}.{ALPHA}"] = alpha
    meta = without_layout_headers(metadata)
    return out, meta


def _alpha_tensor(value: float, dtype_name: str | None = None) -> torch.Tensor:
    dtype = getattr(torch, dtype_name or "float32", torch.float32)
    if not isinstance(dtype, torch.dtype):
        dtype = torch.float32
    return torch.tensor(value, dtype=dtype)


def _join_module(layer: Layer, parts: Mapping[int, tuple], record: Mapping | None):
    """One kohya (down, up, alpha tensor or None) from per-part (lora_A, lora_B, alpha)."""
    count = len(layer.parts)
    if record and _fits_record(layer, parts, record):
        return _from_record(layer, parts, record)
    if count == 1:
        lora_a, lora_b, alpha = parts[0]
        return lora_a.clone(), layer.join([lora_b]).clone(), _alpha_tensor(alpha)
    present = sorted(parts)
    downs = [parts[i][0].reshape(parts[i][0].shape[0], -1) for i in present]
    alphas = [parts[i][2] for i in present]
    if (
        len(present) == count
        and all(torch.equal(downs[0], d) for d in downs[1:])
        and len(set(alphas)) == 1
    ):
        # one shared down: a dense fused module (kohya's default for q, k and v)
        ups = [parts[i][1].reshape(parts[i][1].shape[0], -1) for i in range(count)]
        return downs[0].clone(), layer.join(ups), _alpha_tensor(alphas[0])
    ranks = [d.shape[0] for d in downs]
    scales = [a / r for a, r in zip(alphas, ranks, strict=True)]
    same = all(abs(s - scales[0]) <= 1e-6 * abs(scales[0]) for s in scales)
    rows = layer.rows
    ref = parts[present[0]][1]
    up = ref.new_zeros((sum(rows), sum(ranks)))
    row_starts = [sum(rows[:i]) for i in range(count)]
    col = 0
    for i, rank, scale in zip(present, ranks, scales, strict=True):
        block = parts[i][1].reshape(rows[i], rank)
        if not same:
            block = (block.float() * scale).to(block.dtype)
        up[row_starts[i] : row_starts[i] + rows[i], col : col + rank] = block
        col += rank
    alpha = scales[0] * sum(ranks) if same else float(sum(ranks))
    if layer.swapped_halves:
        up = layer.join([up])
    return torch.cat(downs, dim=0), up, _alpha_tensor(alpha)


def _fits_record(layer: Layer, parts, record) -> bool:
    if len(parts) != len(layer.parts):
        return False
    down_shape, up_shape = record.get("down_shape"), record.get("up_shape")
    if not isinstance(down_shape, list) or not isinstance(up_shape, list):
        return False
    rank = down_shape[0]
    if record.get("dense"):
        return all(p[0].shape[0] == rank for p in parts.values())
    return sum(p[0].shape[0] for p in parts.values()) == rank


def _from_record(layer: Layer, parts, record):
    """The kohya tensors exactly as they were written before ``kohya_to_diffusers``."""
    count = len(layer.parts)
    down_shape, up_shape = record["down_shape"], record["up_shape"]
    ups = [parts[i][1].reshape(parts[i][1].shape[0], -1) for i in range(count)]
    if count == 1 or record.get("dense"):
        down, up = parts[0][0], layer.join(ups)
    else:
        down = torch.cat([parts[i][0].reshape(parts[i][0].shape[0], -1) for i in range(count)])
        rank = down.shape[0] // count
        full = ups[0].new_zeros((sum(layer.rows), down.shape[0]))
        row = 0
        for i, block in enumerate(ups):
            full[row : row + block.shape[0], i * rank : (i + 1) * rank] = block
            row += block.shape[0]
        up = layer.join([full])
    alpha = record.get("alpha")
    alpha_tensor = None if alpha is None else _alpha_tensor(alpha, record.get("alpha_dtype"))
    return (
        down.reshape(down_shape).clone(),
        up.reshape(up_shape).clone(),
        alpha_tensor,
    )
