"""Gradient checkpointing that keeps Chroma's attention mask in its single-stream blocks.

diffusers 0.42.1's ChromaTransformer2DModel hands its checkpointing function a single block's
(hidden_states, temb, image_rotary_emb) and leaves the attention mask out, while the same block
without checkpointing gets it. With gradient_checkpointing on, the single blocks would attend to
every T5 padding token, and a LoRA would train on other activations than the model computes
when sampling (and than a run without checkpointing). For the length of one transformer call,
the checkpointing function is wrapped to hand that call's mask to each single block, as a
checkpointed argument, so the backward pass recomputes the block with the same mask.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

from library.networks.kohya_names import unwrap

# The arguments diffusers passes a checkpointed single block; the mask is the next one.
_SINGLE_BLOCK_ARGS = 3


@contextlib.contextmanager
def single_blocks_masked(denoiser: torch.nn.Module, mask: torch.Tensor | None) -> Iterator[None]:
    """Inside the block, a checkpointed single block of ``denoiser`` gets ``mask`` as its
    attention mask (nothing changes without checkpointing or without a mask)."""
    from diffusers.models.transformers.transformer_chroma import ChromaSingleTransformerBlock

    model = unwrap(denoiser)
    checkpoint = getattr(model, "_gradient_checkpointing_func", None)
    if mask is None or checkpoint is None or not getattr(model, "gradient_checkpointing", False):
        yield
        return

    def with_mask(block, *args):
        if isinstance(block, ChromaSingleTransformerBlock) and len(args) == _SINGLE_BLOCK_ARGS:
            args = (*args, mask)
        return checkpoint(block, *args)

    model._gradient_checkpointing_func = with_mask
    try:
        yield
    finally:
        model._gradient_checkpointing_func = checkpoint
