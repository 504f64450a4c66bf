"""Qwen-Image-Edit's hooks, which Qwen-Image's family calls for its edit variants
(variant.py): the caption read with the references, the reference latents as the denoiser's
context, the reference size and the sampling pipeline. See family.py for the facts they follow.
"""

from __future__ import annotations

import dataclasses

from PIL import Image

from library.models.conditioning import TextConditioning
from library.models.families.edit_variant import EditHooks
from library.models.families.qwenimage_edit.conditioning import (
    CONDITION_AREA,
    edit_texts,
    encode_with_images,
    plus_texts,
    to_pil,
)
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
