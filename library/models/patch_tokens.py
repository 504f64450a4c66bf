"""Latents as tokens of 2x2 patches, with (index, row, column) position ids: the codec of the
transformers whose pipelines pack latents before the model (its own patch size is 1).

A patch's four values per channel are channel-major (``c * 4 + 2 * dy + dx``), as diffusers'
``_pack_latents`` orders them; the position ids are (0, row, column) per patch, the first axis
left for what a family puts beside the image (text tokens at 0, reference images at 1, ...).
"""

from __future__ import annotations

import torch

PATCH = 2


def pack_latents(latents: torch.Tensor) -> torch.Tensor:
    """[B, C, H, W] latents -> [B, (H/2)(W/2), 4C] tokens, each a 2x2 patch (channel-major)."""
    b, c, h, w = latents.shape
    patches = latents.view(b, c, h // PATCH, PATCH, w // PATCH, PATCH)
    return patches.permute(0, 2, 4, 1, 3, 5).reshape(b, (h // PATCH) * (w // PATCH), c * 4)


def unpack_latents(tokens: torch.Tensor, channels: int, height: int, width: int) -> torch.Tensor:
    """The inverse of ``pack_latents``."""
    b = tokens.shape[0]
    patches = tokens.view(b, height // PATCH, width // PATCH, channels, PATCH, PATCH)
    return patches.permute(0, 3, 1, 4, 2, 5).reshape(b, channels, height, width)


def image_position_ids(height: int, width: int, device, dtype) -> torch.Tensor:
    """[(H/2)(W/2), 3] position ids (0, row, column) of the packed image tokens."""
    rows = torch.arange(height // PATCH, device=device).repeat_interleave(width // PATCH)
    cols = torch.arange(width // PATCH, device=device).repeat(height // PATCH)
    return torch.stack([torch.zeros_like(rows), rows, cols], dim=1).to(dtype)
