"""Merge a kohya LoRA file into a plain (adapter-free) model's weights.

This is an independent computation of what an adapter does (``W += m * alpha / r * up @ down``),
which the tests check the adapters and the LoRA tools against (the shipped merge is
library/lora_tools/merge_into_model.py).
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import nn

from library.errors import CheckpointError
from library.models.families.registry import unet_key_layout
from library.networks.kohya_names import ALPHA, DOWN, UP, kohya_name, kohya_path


def lora_delta(
    down: torch.Tensor, up: torch.Tensor, scale: float, weight_shape: torch.Size
) -> torch.Tensor:
    """``scale * up @ down`` in float32, shaped like the adapted weight.

    Linear: up [out, r] @ down [r, in]. Conv: down [r, in, kh, kw] keeps the kernel and up
    [out, r, 1, 1] mixes its channels, so the product is an [out, in, kh, kw] kernel.
    """
    down, up = down.float(), up.float()
    up2 = up.reshape(up.shape[0], up.shape[1])
    if len(weight_shape) == 2:
        delta = up2 @ down.reshape(down.shape[0], -1)
    else:
        kernel = down.reshape(down.shape[0], weight_shape[1], *weight_shape[2:])
        delta = torch.einsum("or,rikl->oikl", up2, kernel)
    return scale * delta.reshape(weight_shape)


def _plain_layers(model: nn.Module, prefix: str) -> dict[str, nn.Module]:
    """kohya name -> Linear/Conv2d of a model without adapters."""
    return {
        kohya_name(prefix, kohya_path(model, path, unet_key_layout)): module
        for path, module in model.named_modules()
        if isinstance(module, (nn.Linear, nn.Conv2d))
    }


@torch.no_grad()
def merge_lora_file(
    model: nn.Module,
    tensors: Mapping[str, torch.Tensor],
    prefix: str,
    multiplier: float = 1.0,
) -> int:
    """Add ``multiplier * alpha / r * up @ down`` of every ``prefix`` module to ``model``.

    Keys of other prefixes are ignored (merge the UNet and the text encoder in two calls).
    A module of the file that ``model`` lacks is a CheckpointError. Returns the number of
    merged modules.
    """
    layers = _plain_layers(model, prefix)
    head = prefix.rstrip("_") + "_"
    names = sorted({k.split(".", 1)[0] for k in tensors if k.startswith(head)})
    for name in names:
        layer = layers.get(name)
        if layer is None:
            raise CheckpointError(f"LoRA module {name} has no matching layer in the model")
        if f"{name}.{DOWN}" not in tensors or f"{name}.{UP}" not in tensors:
            raise CheckpointError(f"LoRA module {name} lacks its {DOWN} or {UP} tensor")
        down, up = tensors[f"{name}.{DOWN}"], tensors[f"{name}.{UP}"]
        alpha_key = f"{name}.{ALPHA}"
        rank = down.shape[0]
        alpha = float(tensors[alpha_key].float().item()) if alpha_key in tensors else float(rank)
        delta = lora_delta(down, up, multiplier * alpha / rank, layer.weight.shape)
        merged = layer.weight.float() + delta.to(layer.weight.device)
        layer.weight.copy_(merged.to(layer.weight.dtype))
    return len(names)
