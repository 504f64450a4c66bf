"""Captions read with their reference images -> Qwen-Image-Edit's text conditioning, as
``QwenImageEditPipeline._get_qwen_prompt_embeds`` makes it.

The facts (diffusers 0.42.1, pipelines/qwenimage/pipeline_qwenimage_edit.py):

- each caption goes into the edit template below (a system turn asking to describe the input
  image and how the instruction changes it; the user turn holds the image, then the caption);
- the texts and the reference images go through Qwen2.5-VL's processor together (processor.py)
  and Qwen2.5-VL runs on the ids with the images' pixels and patch grids; the conditioning is
  its last hidden state;
- each caption keeps its unpadded positions and drops its first 64 (the template's system turn
  and the user turn's opening), then the batch is zero-padded with a mask of the lengths, as
  Qwen-Image's text conditioning is;
- the image the encoder reads is the reference as the pipeline resized it, the same pixels the
  VAE encodes: here, the reference at the size it is trained at.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from PIL import Image

from library.models.families.qwenimage import conditioning as captions_

_SYSTEM = (
    "<|im_start|>system\nDescribe the key features of the input image (color, shape, size, "
    "texture, objects, background), then explain how the user's text instruction should alter "
    "or modify the image. Generate a new image that meets the user's requirements while "
    "maintaining consistency with the original input where appropriate.<|im_end|>\n"
)
# Qwen-Image-Edit: the one image, then the caption, in the user turn.
TEMPLATE = (
    _SYSTEM + "<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>{}<|im_end|>\n"
    "<|im_start|>assistant\n"
)
# Qwen-Image-Edit-2509/2511 (QwenImageEditPlusPipeline): each image numbered, then the caption.
PLUS_TEMPLATE = _SYSTEM + "<|im_start|>user\n{}<|im_end|>\n<|im_start|>assistant\n"
PICTURE = "Picture {}: <|vision_start|><|image_pad|><|vision_end|>"
DROP_TOKENS = 64  # the pipelines' prompt_template_encode_start_idx
# The Plus pipeline shows Qwen2.5-VL each reference at about this many pixels (its
# CONDITION_IMAGE_SIZE), at the reference's aspect ratio, sides multiples of 32.
CONDITION_AREA = 384 * 384


def to_pil(pixels: torch.Tensor) -> Image.Image:
    """A [3, H, W] image in [-1, 1] as the 8-bit RGB image it was read from."""
    values = ((pixels.detach().float().cpu().clamp(-1, 1) + 1) * 127.5).round()
    return Image.fromarray(values.permute(1, 2, 0).numpy().astype(np.uint8))


def edit_texts(captions: Sequence[str]) -> list[str]:
    """Qwen-Image-Edit's texts: each caption after its one image."""
    return [TEMPLATE.format(c) for c in captions]


def plus_texts(captions: Sequence[str], images: int) -> list[str]:
    """Qwen-Image-Edit-2509's texts: "Picture 1: <image>Picture 2: <image>..." and the caption."""
    pictures = "".join(PICTURE.format(i + 1) for i in range(images))
    return [PLUS_TEMPLATE.format(pictures + c) for c in captions]


def encode_with_images(
    processor, encoder, texts: Sequence[str], images: Sequence[Image.Image], device
) -> tuple[torch.Tensor, torch.Tensor]:
    """(zero-padded states [B, max L_i, width], lengths [B]) of each templated text read with
    its images (``images``: every text's, in order, one per ``<|image_pad|>``)."""
    inputs = processor(text=list(texts), images=list(images), padding=True).to(device)
    hidden = encoder(
        input_ids=inputs["input_ids"],
        attention_mask=inputs["attention_mask"],
        pixel_values=inputs["pixel_values"].to(next(encoder.parameters()).dtype),
        image_grid_thw=inputs["image_grid_thw"],
        output_hidden_states=True,
    ).hidden_states[captions_.HIDDEN_STATE_INDEX]
    mask = inputs["attention_mask"].bool()
    kept = [states[keep][DROP_TOKENS:] for states, keep in zip(hidden, mask, strict=True)]
    return captions_.padded(kept)
