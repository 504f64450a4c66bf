"""Max-norm regularisation of adapter updates (kohya's ``scale_weight_norms``).

After each optimizer step, every adapter whose weight update ``alpha / r * up @ down`` has a
Frobenius norm above the limit is scaled back onto it. up and down are each multiplied by the
square root of the ratio, so their product shrinks by the ratio and neither factor is favoured.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import torch
from torch import nn

from library.networks.adapters import lycoris_layers
from library.networks.lora import ADAPTER, lora_layers


@dataclass(frozen=True)
class NormStats:
    """What one application did: how many adapters were scaled, and the norms before."""

    scaled: int
    mean_norm: float
    max_norm: float


@torch.no_grad()
def apply_max_norm(models: Iterable[nn.Module], limit: float) -> NormStats:
    """Scale every adapter of ``models`` whose update norm exceeds ``limit`` back to it."""
    norms, scaled = [], 0
    for model in models:
        for layer in lora_layers(model).values():
            down = layer.lora_A[ADAPTER].weight
            up = layer.lora_B[ADAPTER].weight
            scale = layer.scaling[ADAPTER]
            # the norm of the [out, in * kh * kw] product is that of the update, for any kernel
            update = (up.float().flatten(1) @ down.float().flatten(1)) * scale
            norm = update.norm()
            norms.append(norm)
            if norm > limit:
                root = (limit / norm).sqrt()
                up.mul_(root.to(up.dtype))
                down.mul_(root.to(down.dtype))
                scaled += 1
        # LyCORIS layers scale their own factors (a LoHa has four, a LoKr two or more).
        for layer in lycoris_layers(model).values():
            norm, was_scaled = layer.apply_max_norm(limit)
            norms.append(torch.as_tensor(float(norm)))
            scaled += int(was_scaled)
    if not norms:
        return NormStats(0, 0.0, 0.0)
    stacked = torch.stack(norms)
    return NormStats(scaled, stacked.mean().item(), stacked.max().item())
