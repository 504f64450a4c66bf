"""kohya's layout -> diffusers' (peft) and ComfyUI's (layouts.py describes the three).

A fused kohya module (q, k and v in one) becomes diffusers' per-Linear parts, slices of it; its
alphas and shapes are kept in the header entry ``difftune.kohya_modules`` so that to_kohya.py
gives the input back bit for bit.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping

import torch

from library.errors import CheckpointError
from library.lora_tools.base_model import Layer, component_label, family_label
from library.lora_tools.comfyui_keys import comfy_name
from library.lora_tools.common import ALPHA, DOWN, UP
from library.lora_tools.layouts import (
    DIFFUSERS_HEADER,
    KOHYA_HEADER,
    LORA_A,
    LORA_B,
    diffusers_component,
    diffusers_path,
    loadable_components,
    without_layout_headers,
)
from library.models.families.registry import entry_of
from library.networks.kohya_names import group_modules
from library.networks.linear_files import fold_into_peft


def kohya_to_layout(
    layout: str, tensors, metadata, table: Mapping[str, Layer], components, fold: bool = False
):
    """kohya modules in ``layout`` (one of layouts.LAYOUTS): (tensors, metadata)."""
    if layout == "diffusers":
        return kohya_to_diffusers(tensors, metadata, table, components, fold)
    if layout == "comfyui":
        out, meta = kohya_to_comfy(tensors, metadata, table, components)
        folds = entry_of(components.family).tool.folds_alpha
        return (fold_into_peft(out) if folds else out), meta
    return dict(tensors), dict(metadata)


def kohya_to_comfy(tensors, metadata, table: Mapping[str, Layer], components):
    """Rename kohya modules to ComfyUI's names; every tensor (LyCORIS ones too) is kept."""
    out = {}
    for name, parts in group_modules(tensors).items():
        new = comfy_name(table[name], components)
        if new is None:
            what = component_label(components, table[name].component)
            raise CheckpointError(
                f"{name}: ComfyUI's names for the {what} of {family_label(components.family)} "
                "models are not known here, so it has no place in the comfyui layout; keep the "
                "file in kohya's layout"
            )
        for suffix, tensor in parts.items():
            out[f"{new}.{suffix}"] = tensor
    return out, dict(metadata)


def _plain(name: str, parts: Mapping[str, torch.Tensor], what: str) -> None:
    extra = sorted(set(parts) - {DOWN, UP, ALPHA})
    if extra or DOWN not in parts or UP not in parts:
        detail = f"{name}.{extra[0]}" if extra else f"{name} without lora_down/lora_up"
        raise CheckpointError(
            f"{detail}: {what} holds only plain LoRA factors (lora_down/lora_up/alpha); "
            "LyCORIS modules (LoHa, LoKr, DoRA, Tucker) cannot be written in it"
        )


def split_module(layer: Layer, down: torch.Tensor, up: torch.Tensor, alpha: float | None):
    """Per-part (down, up, alpha or None) of a kohya module, and whether it was dense.

    A fused module whose up is block-diagonal with equal part ranks (difftune's files, kohya's
    split_qkv) splits into its blocks, each with alpha / n; any other gives every part the whole
    down and its rows of up. Rows come back in diffusers' order (swapped halves undone). A
    missing alpha (scale 1) stays None.
    """
    ups = layer.split(up)
    if not layer.fused:
        return [(down, ups[0], alpha)], False
    rank, count = down.shape[0], len(layer.parts)
    if rank % count == 0:
        part = rank // count
        blocks = all(
            not u[:, : i * part].any() and not u[:, (i + 1) * part :].any()
            for i, u in enumerate(ups)
        )
        if blocks:
            each = None if alpha is None else alpha / count
            return [
                (down[i * part : (i + 1) * part], u[:, i * part : (i + 1) * part], each)
                for i, u in enumerate(ups)
            ], False
    return [(down, u, alpha) for u in ups], True


def _peft_shape(tensor: torch.Tensor, module: torch.nn.Module, kind: str) -> torch.Tensor:
    """``tensor`` shaped as peft's lora_A / lora_B of ``module``: 2-d for a Linear, 4-d for a
    Conv2d (lora_A carries the kernel, lora_B is 1x1)."""
    if isinstance(module, torch.nn.Conv2d):
        if tensor.dim() == 2:
            if kind == LORA_A:
                return tensor.reshape(tensor.shape[0], module.in_channels, *module.kernel_size)
            return tensor.reshape(*tensor.shape, 1, 1)
        return tensor
    return tensor.reshape(tensor.shape[0], tensor.shape[1]) if tensor.dim() == 4 else tensor


def kohya_to_diffusers(tensors, metadata, table: Mapping[str, Layer], components, fold: bool):
    """kohya modules -> diffusers' peft keys, the alphas in diffusers' header (or folded)."""
    loadable = loadable_components(components)
    out: dict[str, torch.Tensor] = {}
    configs: dict[str, dict[str, tuple[int, float]]] = {}
    record = {}
    for name, parts in sorted(group_modules(tensors).items()):
        _plain(name, parts, "diffusers' layout")
        layer = table[name]
        component = diffusers_component(layer, components)
        if component not in loadable:
            what = component_label(components, layer.component)
            raise CheckpointError(
                f"{name}: the {what} has no place in diffusers' {family_label(components.family)} "
                f"LoRA layout (its pipeline loads LoRA weights into {', '.join(loadable)} only); "
                "keep the file in kohya's layout"
            )
        alpha_tensor = parts.get(ALPHA)
        alpha = None if alpha_tensor is None else float(alpha_tensor.float().item())
        down, up = parts[DOWN], parts[UP]
        pieces, dense = split_module(layer, down, up, alpha)
        record[name] = {
            "alpha": alpha,
            "alpha_dtype": None if alpha_tensor is None else str(alpha_tensor.dtype).split(".")[-1],
            "down_shape": list(down.shape),
            "up_shape": list(up.shape),
            "dense": dense,
        }
        for index, (part_down, part_up, part_alpha) in enumerate(pieces):
            module = layer.modules[index]
            path = diffusers_path(layer, index)
            rank = int(part_down.shape[0])
            scale = 1.0 if part_alpha is None else part_alpha / rank
            lora_b = _peft_shape(part_up, module, LORA_B)
            if fold and scale != 1.0:
                lora_b = (lora_b.float() * scale).to(part_up.dtype)
            out[f"{component}.{path}.{LORA_A}"] = _peft_shape(part_down, module, LORA_A).clone()
            out[f"{component}.{path}.{LORA_B}"] = lora_b.clone()
            alpha_value = float(rank) if fold or part_alpha is None else part_alpha
            configs.setdefault(component, {})[path] = (rank, alpha_value)
    meta = without_layout_headers(metadata)
    header = _adapter_metadata(configs)
    if header:
        meta[DIFFUSERS_HEADER] = json.dumps(header, indent=2, sort_keys=True)
    if not fold:
        meta[KOHYA_HEADER] = json.dumps(record, sort_keys=True)
    return out, meta


def _pattern(path: str) -> str:
    """A peft rank/alpha pattern matching exactly the module ``path`` (its text_model. prefix
    left out, so it also matches transformers 5's flattened CLIP)."""
    return re.escape(path.removeprefix("text_model."))


def _adapter_metadata(configs: Mapping[str, Mapping[str, tuple[int, float]]]) -> dict:
    """diffusers' lora_adapter_metadata (LoraConfig keywords per component) giving each path
    its rank and alpha; empty when every alpha equals its rank (the layout's default)."""
    if all(rank == alpha for paths in configs.values() for rank, alpha in paths.values()):
        return {}
    header = {}
    for component, paths in sorted(configs.items()):
        ranks = [rank for rank, _ in paths.values()]
        alphas = [alpha for _, alpha in paths.values()]
        r = max(set(ranks), key=ranks.count)
        lora_alpha = max(set(alphas), key=alphas.count)
        header.update(
            {
                f"{component}.r": r,
                f"{component}.lora_alpha": lora_alpha,
                f"{component}.target_modules": sorted(
                    path.removeprefix("text_model.") for path in paths
                ),
                f"{component}.rank_pattern": {
                    _pattern(p): rank for p, (rank, _) in sorted(paths.items()) if rank != r
                },
                f"{component}.alpha_pattern": {
                    _pattern(p): alpha
                    for p, (_, alpha) in sorted(paths.items())
                    if alpha != lora_alpha
                },
            }
        )
    return header
