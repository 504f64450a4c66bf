"""Qwen-Image-Edit: Qwen-Image's transformer, VAE and objective, with a reference image read
twice, as QwenImageEditPipeline reads it. No family class of its own: Qwen-Image's family with
its edit variant (variant.py) and its hooks (hooks.py), which Qwen-Image's family calls.

- by Qwen2.5-VL together with the caption (conditioning.py: the edit template, 64 tokens
  dropped), so the text cache knows an entry by its caption and its reference;
- by the VAE: encoded with the posterior's mode and normalised per channel like the target's
  latents, packed into 2x2 patches and appended after the noisy image's tokens, with its own
  frame grid in ``img_shapes`` ([(1, h/2, w/2), (1, h_ref/2, w_ref/2)] per sample); the
  transformer's output for the reference tokens is dropped.

Qwen-Image-Edit-2509 and 2511 (QwenImageEditPlusPipeline) take one or more references per
sample, numbered in the caption's text ("Picture 1: ..."), each shown to Qwen2.5-VL at about
384 x 384 pixels while the VAE encodes it at its trained size.
"""

from __future__ import annotations

import dataclasses

from library.models.families.qwenimage.family import QwenImageFamily, qwenimage_family
from library.models.families.qwenimage_edit.variant import EDIT, PLUS_EDIT


def qwenimage_edit_family(plus: bool = False, flow=None) -> QwenImageFamily:
    """The Qwen-Image-Edit family (``plus``: 2509/2511): Qwen-Image's settings (the [flow]
    section's among them) under its own names, with the processor beside the tokenizer."""
    names = (
        {"name": "qwenimage-edit-plus", "base_model_version": "qwen_image_edit_plus",
         "modelspec_architecture": "Qwen-Image-Edit-2509", "edit": PLUS_EDIT}
        if plus
        else {"name": "qwenimage-edit", "base_model_version": "qwen_image_edit",
              "modelspec_architecture": "Qwen-Image-Edit", "edit": EDIT}
    )  # fmt: skip
    return dataclasses.replace(
        qwenimage_family(flow), **names, tokenizer_subfolders=("tokenizer", "processor")
    )
