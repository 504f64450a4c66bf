"""Sampling Qwen-Image-Edit during training: diffusers' QwenImageEditPipeline fed our
conditioning and the prompt's reference image.

The pipeline takes the reference as a PIL image and resizes it to about 1024 x 1024 pixels at
its own aspect ratio (sides multiples of 32; ``pipeline_reference_size``) for both Qwen2.5-VL
and the VAE; the Plus pipeline (2509/2511) takes a list of references and shows Qwen2.5-VL
each at about 384 x 384 pixels instead. The sampler fits the prompt's reference to that size before encoding the caption
with it, and hands the pipeline that fitted image, so the pipeline's resize keeps it and its
latents come from the same pixels. Everything else is Qwen-Image's (qwenimage/sampling.py).
"""

from __future__ import annotations

import dataclasses
import math

from library.models.conditioning import Conditioning
from library.models.families.base import REFERENCE_LATENTS_KEY as REFERENCES
from library.models.families.base import REFERENCE_PIXELS_KEY as PIPELINE_IMAGES
from library.models.families.qwenimage.sampling import (
    qwenimage_pipeline_inputs,
    qwenimage_pipeline_kind,
)
from library.models.families.qwenimage_edit.conditioning import to_pil

PIPELINE = "QwenImageEditPipeline"
PLUS_PIPELINE = "QwenImageEditPlusPipeline"  # Qwen-Image-Edit-2509 and 2511
# Conditioning inputs (Qwen-Image's assemble_conditioning carries them): REFERENCES, the
# reference latents [B, C, 1, h, w] for predict, and PIPELINE_IMAGES, the reference pixels
# [B, 3, H, W] the sampling pipeline takes as its image.
_AREA = 1024 * 1024  # the pipeline's reference area


def pipeline_reference_size(size: tuple[int, int], area: int = _AREA) -> tuple[int, int]:
    """(width, height) the pipelines resize a reference of ``size`` to (their
    calculate_dimensions: ``area``, 1024 x 1024 by default, at the reference's aspect ratio,
    each side rounded to a multiple of 32)."""
    ratio = size[0] / size[1]
    width = math.sqrt(area * ratio)
    height = width / ratio
    return round(width / 32) * 32, round(height / 32) * 32


def edit_pipeline_kind():
    """QwenImageEditPipeline with Qwen-Image's prompt defaults."""
    return dataclasses.replace(
        qwenimage_pipeline_kind(), class_name=PIPELINE, call_inputs=edit_inputs
    )


def edit_plus_pipeline_kind():
    """QwenImageEditPlusPipeline (Qwen-Image-Edit-2509/2511) with Qwen-Image's prompt
    defaults; it takes the prompt's references as a list."""
    return dataclasses.replace(
        qwenimage_pipeline_kind(), class_name=PLUS_PIPELINE, call_inputs=edit_plus_inputs
    )


def _inputs_and_references(cond: Conditioning, prompt) -> tuple[dict, list]:
    """Qwen-Image's call keywords, and the prompt's fitted references as images."""
    kwargs = dict(cond.unet_kwargs)
    kwargs.pop(REFERENCES, None)
    pixels = kwargs.pop(PIPELINE_IMAGES, None) or []
    inputs = qwenimage_pipeline_inputs(Conditioning(cond.encoder_hidden_states, kwargs), prompt)
    return inputs, [to_pil(slot[0]) for slot in pixels]


def edit_inputs(cond: Conditioning, prompt) -> dict:
    """Qwen-Image's call keywords and the fitted reference as ``image``."""
    inputs, images = _inputs_and_references(cond, prompt)
    if images:
        (inputs["image"],) = images  # Qwen-Image-Edit takes one reference
    return inputs


def edit_plus_inputs(cond: Conditioning, prompt) -> dict:
    """Qwen-Image's call keywords and the fitted references as ``image`` (a list)."""
    inputs, images = _inputs_and_references(cond, prompt)
    if images:
        inputs["image"] = images
    return inputs
