"""Qwen-Image-Edit: Qwen-Image's transformer, VAE and objective, with a reference image read
twice, as QwenImageEditPipeline reads it. No family class of its own: Qwen-Image's family with
the edit variant of its entry (entry.py) and the hooks below, which Qwen-Image's family calls.

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

from PIL import Image

from library.models.conditioning import TextConditioning
from library.models.families.edit_variant import EditHooks
from library.models.families.qwenimage.family import QwenImageFamily, qwenimage_family
from library.models.families.qwenimage_edit.conditioning import (
    CONDITION_AREA,
    edit_texts,
    encode_with_images,
    plus_texts,
    to_pil,
)
from library.models.families.qwenimage_edit.entry import EDIT, PLUS_EDIT
from library.models.families.qwenimage_edit.sampling import (
    REFERENCES,
    edit_pipeline_kind,
    edit_plus_pipeline_kind,
    pipeline_reference_size,
)


def edit_text(family, tokenizers, text_encoders, captions, references, device):
    """Qwen2.5-VL's states of each caption read with its reference image."""
    (pixels,) = references  # one reference per sample
    (encoder,) = text_encoders
    images = [to_pil(image) for image in pixels]
    texts = edit_texts(captions)
    states, lengths = encode_with_images(tokenizers[1], encoder, texts, images, device)
    return TextConditioning(states, None, None, lengths=lengths)


def plus_text(family, tokenizers, text_encoders, captions, references, device):
    """Qwen2.5-VL's states of each caption read with its numbered references, each resized
    (stretched, Lanczos) to the Plus pipeline's condition size for its aspect ratio."""
    (encoder,) = text_encoders
    images = [
        _condition_image(to_pil(slot[row])) for row in range(len(captions)) for slot in references
    ]
    texts = plus_texts(captions, len(references))
    states, lengths = encode_with_images(tokenizers[1], encoder, texts, images, device)
    return TextConditioning(states, None, None, lengths=lengths)


def _condition_image(image: Image.Image) -> Image.Image:
    """``image`` as the Plus pipeline shows it to Qwen2.5-VL."""
    size = pipeline_reference_size(image.size, CONDITION_AREA)
    return image if image.size == size else image.resize(size, Image.Resampling.LANCZOS)


# Qwen-Image-Edit: the reference latents after the noisy image's, the caption read with the
# reference, the pipeline's reference size (about 1024 x 1024 pixels at the reference's aspect
# ratio, sides multiples of 32) for a sample prompt's reference
HOOKS = EditHooks(
    context=lambda family, cond: list(cond.unet_kwargs.get(REFERENCES, ())),
    sampling_pipeline=lambda family: edit_pipeline_kind(),
    text_with_references=edit_text,
    reference_size=lambda family, size, width, height: pipeline_reference_size(size),
)
PLUS_HOOKS = dataclasses.replace(
    HOOKS,
    sampling_pipeline=lambda family: edit_plus_pipeline_kind(),
    text_with_references=plus_text,
)


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
