"""Calling Z-Image's transformer on a batch of latents, as ``ZImagePipeline`` calls it.

The facts (diffusers 0.42.1, ZImagePipeline.__call__ and ZImageTransformer2DModel.forward):

- Latents are the VAE's 16 channels at 1/8 of the image size, [B, 16, H/8, W/8]; the pipeline
  needs image sides that are multiples of 16, so H/8 and W/8 are even.
- The transformer takes a **list** of per-image [C, F, h, w] tensors, an image being a one-frame
  video (F = 1): the pipeline unsqueezes the frame axis and unbinds the batch. Inside, each image
  is cut into 1 x 2 x 2 (frame, row, column) patches, so h/2 * w/2 tokens of 64 values, padded
  to a multiple of 32 tokens with a learned pad token. Images of different sizes can share a
  batch (each item carries its own size).
- The caption conditioning is the list of [L_i, 2560] tensors of conditioning.py, one per image
  (the family's ``predict`` makes the call).
- The timestep input is 1 - sigma in [0, 1] (0 at pure noise), one per image; the model
  multiplies it by t_scale = 1000 before its sinusoidal embedding.
- Each item is one sequence [image tokens, caption tokens] (each part padded to 32 with its
  pad token, which is attended, not masked; only the batch padding is masked). RoPE positions
  (axis 0, row, column): caption token k at (1 + k, 0, 0), image patch (r, c) at
  (caption length padded to 32 + 1, r, c).
- The output is a list of [C, F, h, w] tensors; the pipeline stacks them, drops F and negates
  them before the scheduler step: the raw output is x0 - noise, the **negative** of the
  velocity d x_t / d sigma (see objective.py).
- Classifier-free guidance (guidance_scale > 0) runs the positive and negative captions as one
  batch of 2B and combines pos + guidance_scale * (pos - neg) in float32, so the pipeline's
  guidance_scale g is the usual scale g + 1 (0 turns guidance off, as Turbo is sampled).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from library.models.families.zimage.shapes import PATCH_SIZE


def pack(latents: torch.Tensor) -> list[torch.Tensor]:
    """[B, C, h, w] -> the transformer's input list of B one-frame [C, 1, h, w] tensors."""
    if latents.dim() != 4:
        raise ValueError(f"latents must be [B, C, h, w]; got {tuple(latents.shape)}")
    h, w = latents.shape[-2:]
    if h % PATCH_SIZE or w % PATCH_SIZE:
        raise ValueError(
            f"latent size {h}x{w} is not a multiple of the {PATCH_SIZE}x{PATCH_SIZE} patch: "
            f"image sides must be multiples of {8 * PATCH_SIZE} pixels"
        )
    return list(latents.unsqueeze(2).unbind(dim=0))


def unpack(outputs: Sequence[torch.Tensor]) -> torch.Tensor:
    """The transformer's list of [C, 1, h, w] outputs -> [B, C, h, w] (same sizes required)."""
    return torch.stack(list(outputs), dim=0).squeeze(2)
