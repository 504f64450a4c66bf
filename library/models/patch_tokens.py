"""Latents as a transformer's patch tokens, and the tokens' (index, row, column) positions: the
codec of the transformers whose pipelines pack latents before the model (the model's own patch
size is then 1).

The facts (diffusers 0.42.1, the pipelines' ``_pack_latents`` / ``_unpack_latents``: FLUX.1's,
Chroma's, QwenImagePipeline's and Krea2Pipeline's): latents are cut into p x p patches, each
token the C channels of its patch times the p x p positions (channel-major: ``c * p * p + p * dy
+ dx``), patches in raster order; the output comes back in the same packing. A token's position
is (0, patch row, patch column); the first axis is left for what a family puts beside the image
(text tokens at 0, reference images at 1, ...). Image latents are [B, C, h, w]
(``pack_latents``); the Qwen-Image VAE's one-frame latents are [B, C, 1, h, w] (``pack``).
Transformers whose codec patchifies (one token per latent pixel) and whose positions have a
fourth axis (t, row, column, l) take ``lattice_ids``.
"""

from __future__ import annotations

import torch

PATCH = 2


def pack_latents(latents: torch.Tensor, patch: int = PATCH) -> torch.Tensor:
    """[B, C, h, w] latents -> [B, (h/p)(w/p), C p p] tokens, each a p x p patch (channel-major)."""
    b, c, h, w = latents.shape
    if h % patch or w % patch:
        raise ValueError(
            f"latent size {h}x{w} is not a multiple of the {patch}x{patch} patch: image sides "
            f"must be multiples of {8 * patch} pixels"
        )
    patches = latents.reshape(b, c, h // patch, patch, w // patch, patch)
    return patches.permute(0, 2, 4, 1, 3, 5).reshape(b, (h // patch) * (w // patch), c * patch**2)


def unpack_latents(
    tokens: torch.Tensor, channels: int, height: int, width: int, patch: int = PATCH
) -> torch.Tensor:
    """The inverse of ``pack_latents`` for a latent of ``height`` x ``width``."""
    b = tokens.shape[0]
    patches = tokens.reshape(b, height // patch, width // patch, channels, patch, patch)
    return patches.permute(0, 3, 1, 4, 2, 5).reshape(b, channels, height, width)


def pack(latents: torch.Tensor, patch: int = PATCH) -> torch.Tensor:
    """One-frame latents [B, C, 1, h, w] -> [B, (h/p)(w/p), C p p]."""
    if latents.dim() != 5 or latents.shape[2] != 1:
        raise ValueError(f"latents must be one-frame [B, C, 1, h, w]; got {tuple(latents.shape)}")
    return pack_latents(latents[:, :, 0], patch)


def unpack(tokens: torch.Tensor, height: int, width: int, patch: int = PATCH) -> torch.Tensor:
    """[B, (h/p)(w/p), C p p] -> one-frame latents [B, C, 1, h, w] of ``height`` x ``width``."""
    channels = tokens.shape[-1] // (patch * patch)
    return unpack_latents(tokens, channels, height, width, patch).unsqueeze(2)


def image_position_ids(height: int, width: int, device, dtype) -> torch.Tensor:
    """[(h/2)(w/2), 3] position ids (0, row, column) of the packed image tokens of a latent of
    ``height`` x ``width``."""
    rows = torch.arange(height // PATCH, device=device).repeat_interleave(width // PATCH)
    cols = torch.arange(width // PATCH, device=device).repeat(height // PATCH)
    return torch.stack([torch.zeros_like(rows), rows, cols], dim=1).to(dtype)


def grid_positions(text_tokens: int, rows: int, columns: int) -> torch.Tensor:
    """[text_tokens + rows * columns, 3] float positions: the caption's tokens at (0, 0, 0),
    then each patch's (0, row, column) in raster order."""
    patches = image_position_ids(rows * PATCH, columns * PATCH, "cpu", torch.float32)
    return torch.cat([torch.zeros(text_tokens, 3), patches])


def lattice_ids(t: int, height: int, width: int, length: int, batch: int, device) -> torch.Tensor:
    """[batch, height * width * length, 4] position ids (t, row, column, l) of the transformers
    whose every latent pixel is one token and whose positions have a fourth axis: an image's
    tokens (``length`` 1) at index ``t``, or (``height`` = ``width`` = 1) ``length`` text tokens;
    rows, then columns, then l."""
    axes = [torch.tensor([t]), torch.arange(height), torch.arange(width), torch.arange(length)]
    return torch.cartesian_prod(*axes).to(device).expand(batch, -1, -1)
