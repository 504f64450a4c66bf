"""Qwen-Image-Edit as a ModelFamily: Qwen-Image's transformer, VAE and objective, with a
reference image read twice, as QwenImageEditPipeline reads it:

- by Qwen2.5-VL together with the caption (conditioning.py: the edit template, 64 tokens
  dropped), so the text cache knows an entry by its caption and its reference;
- by the VAE: encoded with the posterior's mode and normalised per channel like the target's
  latents, packed into 2x2 patches and appended after the noisy image's tokens, with its own
  frame grid in ``img_shapes`` ([(1, h/2, w/2), (1, h_ref/2, w_ref/2)] per sample); the
  transformer's output for the reference tokens is dropped.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from PIL import Image

from library.models.conditioning import TextConditioning
from library.models.families.base import (
    REFERENCE_LATENTS_KEY,
    REFERENCE_PIXELS_KEY,
    derived_family,
    reference_latents,
)
from library.models.families.qwenimage.family import QwenImageFamily, qwenimage_family
from library.models.families.qwenimage_edit.conditioning import (
    CONDITION_AREA,
    edit_texts,
    encode_with_images,
    plus_texts,
    to_pil,
)
from library.models.families.qwenimage_edit.sampling import (
    PIPELINE_IMAGES,
    REFERENCES,
    edit_pipeline_kind,
    edit_plus_pipeline_kind,
    pipeline_reference_size,
)


@dataclass(frozen=True, kw_only=True)
class QwenImageEditFamily(QwenImageFamily):
    """Qwen-Image-Edit (the first release: one reference image per sample)."""

    LABEL: ClassVar[str] = "Qwen-Image-Edit"
    REFERENCE_IMAGES: ClassVar[tuple[int, int | None]] = (1, 1)
    TEXT_READS_REFERENCES: ClassVar[bool] = True

    def describe(self) -> str:
        return super().describe().replace("Qwen-Image", "Qwen-Image-Edit", 1)

    def encode_text(self, tokenizers, text_encoders, captions, device, clip_skip=None,
                    max_token_length=None):  # fmt: skip
        """Captions alone (Qwen-Image's template): only the memory estimate asks, for shapes."""
        return super().encode_text(tokenizers[:1], text_encoders, captions, device)

    def encode_text_with_references(self, tokenizers, text_encoders, captions, references, device):
        """Qwen2.5-VL's states of each caption read with its reference image."""
        (pixels,) = references  # one reference per sample
        (encoder,) = text_encoders
        images = [to_pil(image) for image in pixels]
        texts = edit_texts(captions)
        states, lengths = encode_with_images(tokenizers[1], encoder, texts, images, device)
        return TextConditioning(states, None, None, lengths=lengths)

    def assemble_conditioning(self, text, batch, device, dtype=None):
        """Qwen-Image's conditioning, with the batch's reference latents (and their pixels,
        which the sampling pipeline takes as the image)."""
        cond = super().assemble_conditioning(text, batch, device, dtype)
        batch = batch or {}
        if batch.get(REFERENCE_LATENTS_KEY):
            cond.unet_kwargs[REFERENCES] = reference_latents(batch, device, dtype)
        if batch.get(REFERENCE_PIXELS_KEY):
            cond.unet_kwargs[PIPELINE_IMAGES] = list(batch[REFERENCE_PIXELS_KEY])
        return cond

    def context_latents(self, cond):
        return list(cond.unet_kwargs.get(REFERENCES, ()))

    def sample_reference_size(self, size, width, height):
        """The pipeline's size for a reference of ``size``: about 1024 x 1024 pixels at its own
        aspect ratio, sides multiples of 32."""
        return pipeline_reference_size(size)

    def sampling_pipeline(self):
        """QwenImageEditPipeline fed our conditioning and the prompt's reference image."""
        return edit_pipeline_kind()


@dataclass(frozen=True, kw_only=True)
class QwenImageEditPlusFamily(QwenImageEditFamily):
    """Qwen-Image-Edit-2509 and 2511 (QwenImageEditPlusPipeline): one or more references per
    sample, numbered in the caption's text ("Picture 1: ..."), each shown to Qwen2.5-VL at about
    384 x 384 pixels while the VAE encodes it at its trained size."""

    LABEL: ClassVar[str] = "Qwen-Image-Edit-2509"
    REFERENCE_IMAGES: ClassVar[tuple[int, int | None]] = (1, None)

    def describe(self) -> str:
        return super().describe().replace("Qwen-Image-Edit", "Qwen-Image-Edit-2509/2511", 1)

    def encode_text_with_references(self, tokenizers, text_encoders, captions, references, device):
        """Qwen2.5-VL's states of each caption read with its numbered references, each resized
        (stretched, Lanczos) to the pipeline's condition size for its aspect ratio."""
        (encoder,) = text_encoders
        images = [
            _condition_image(to_pil(slot[row]))
            for row in range(len(captions))
            for slot in references
        ]
        texts = plus_texts(captions, len(references))
        states, lengths = encode_with_images(tokenizers[1], encoder, texts, images, device)
        return TextConditioning(states, None, None, lengths=lengths)

    def sampling_pipeline(self):
        """QwenImageEditPlusPipeline fed our conditioning and the prompt's references."""
        return edit_plus_pipeline_kind()


def _condition_image(image: Image.Image) -> Image.Image:
    """``image`` as the Plus pipeline shows it to Qwen2.5-VL."""
    size = pipeline_reference_size(image.size, CONDITION_AREA)
    return image if image.size == size else image.resize(size, Image.Resampling.LANCZOS)


def qwenimage_edit_family(plus: bool = False, flow=None) -> QwenImageEditFamily:
    """The Qwen-Image-Edit family (``plus``: 2509/2511): Qwen-Image's settings (the [flow]
    section's among them) under its own names, with the processor beside the tokenizer."""
    base = qwenimage_family(flow)
    names = (
        {"name": "qwenimage-edit-plus", "base_model_version": "qwen_image_edit_plus",
         "modelspec_architecture": "Qwen-Image-Edit-2509"}
        if plus
        else {"name": "qwenimage-edit", "base_model_version": "qwen_image_edit",
              "modelspec_architecture": "Qwen-Image-Edit"}
    )  # fmt: skip
    family = QwenImageEditPlusFamily if plus else QwenImageEditFamily
    return derived_family(base, family, **names, tokenizer_subfolders=("tokenizer", "processor"))
