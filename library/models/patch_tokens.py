"""Latents as a transformer's patch tokens, and the tokens' (t, h, w) rotary positions.

The facts (diffusers 0.42.1, the ``_pack_latents`` / ``_unpack_latents`` of the pipelines over
the Qwen-Image VAE, QwenImagePipeline's and Krea2Pipeline's): one-frame latents [B, C, 1, h, w]
are cut into p x p patches, each token the C channels of its patch times the p x p positions
(channel-major: c, row, column), patches in raster order; the output comes back in the same
packing. A token's position is (0, patch row, patch column) (Krea2Pipeline's
``prepare_position_ids``), the caption's tokens all at the origin.
"""

from __future__ import annotations

import torch


def pack(latents: torch.Tensor, patch: int = 2) -> torch.Tensor:
    """[B, C, 1, h, w] -> [B, (h/p)(w/p), C p p]."""
    if latents.dim() != 5 or latents.shape[2] != 1:
        raise ValueError(f"latents must be one-frame [B, C, 1, h, w]; got {tuple(latents.shape)}")
    b, c, _, h, w = latents.shape
    if h % patch or w % patch:
        raise ValueError(
            f"latent size {h}x{w} is not a multiple of the {patch}x{patch} patch: image sides "
            f"must be multiples of {8 * patch} pixels"
        )
    x = latents.reshape(b, c, h // patch, patch, w // patch, patch).permute(0, 2, 4, 1, 3, 5)
    return x.reshape(b, (h // patch) * (w // patch), c * patch * patch)


def unpack(tokens: torch.Tensor, height: int, width: int, patch: int = 2) -> torch.Tensor:
    """[B, (h/p)(w/p), C p p] -> [B, C, 1, h, w] for a latent of ``height`` x ``width``."""
    b, _, channels = tokens.shape
    c = channels // (patch * patch)
    x = tokens.reshape(b, height // patch, width // patch, c, patch, patch)
    return x.permute(0, 3, 1, 4, 2, 5).reshape(b, c, 1, height, width)


def grid_positions(text_tokens: int, rows: int, columns: int) -> torch.Tensor:
    """[text_tokens + rows * columns, 3] float positions: the caption's tokens at (0, 0, 0),
    then each patch's (0, row, column) in raster order."""
    grid = torch.zeros(rows, columns, 3)
    grid[..., 1] = torch.arange(rows)[:, None]
    grid[..., 2] = torch.arange(columns)[None, :]
    return torch.cat([torch.zeros(text_tokens, 3), grid.reshape(rows * columns, 3)])
