"""Calling Qwen-Image's transformer on a batch of latents, as ``QwenImagePipeline`` calls it.

The facts (diffusers 0.42.1, QwenImagePipeline and QwenImageTransformer2DModel.forward):

- Latents are one-frame clips of the video VAE, [B, 16, 1, H/8, W/8] (the latent codec's
  layout); image sides are multiples of 16, so H/8 and W/8 are even.
- The transformer takes them packed into 2x2 patches: [B, (h/2)(w/2), 64], each token the
  16 channels of its patch times the 2x2 positions (channel-major: c, row, column), patches in
  raster order (``_pack_latents``); the output comes back in the same packing
  (``_unpack_latents``).
- ``img_shapes``: per image, the list of its frames' (frames, h/2, w/2) token grids, here
  ``[(1, h/2, w/2)]`` (the RoPE positions of the image tokens).
- The caption states [B, L, 3584] with ``encoder_hidden_states_mask`` [B, L] (None when every
  caption has length L); the text RoPE runs over L positions.
- The timestep input is sigma in [0, 1] (the scheduler's timestep / 1000); no guidance input
  (Qwen-Image is not guidance-distilled).
- The output is the velocity d x_t / d sigma = noise - x0, passed to the Euler step as it is.

The family's ``predict`` makes the call.
"""

from __future__ import annotations

from library.models.families.qwenimage.shapes import PATCH_SIZE
from library.models.patch_tokens import pack, unpack  # the pipeline's packing, 2x2 patches

__all__ = ["img_shapes", "pack", "unpack"]


def img_shapes(batch: int, height: int, width: int) -> list[list[tuple[int, int, int]]]:
    """The transformer's img_shapes for ``batch`` one-frame latents of height x width."""
    return [[(1, height // PATCH_SIZE, width // PATCH_SIZE)]] * batch
