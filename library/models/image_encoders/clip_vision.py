"""CLIP's vision tower as an image encoder: transformers' ``CLIPVisionModel`` with its
``CLIPImageProcessor``, giving the penultimate layer's hidden states of every token (the class
token and the patches), [B, T, hidden], as diffusers' WanImageToVideoPipeline.encode_image
computes them: the processor on the RGB image (resize of the short side, center crop, CLIP's
mean and std), then the tower with ``output_hidden_states`` and ``hidden_states[-2]``.

Training pixels ([-1, 1], the data path's x / 127.5 - 1 of 8-bit values) go back to the 8-bit
image they came from before the processor, so a clip's first frame is encoded as the pipeline
encodes the same frame given as an image."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from PIL import Image

# The released processor of CLIP ViT-H/14 (Wan 2.1 I2V's image_processor/, open_clip's
# transform for the ViT-H towers): 224 pixels, bicubic, OpenAI CLIP's mean and std
CLIP_PROCESSOR = {
    "do_resize": True, "size": {"shortest_edge": 224}, "resample": 3, "do_center_crop": True,
    "crop_size": {"height": 224, "width": 224}, "do_rescale": True, "rescale_factor": 1 / 255,
    "do_normalize": True, "image_mean": [0.48145466, 0.4578275, 0.40821073],
    "image_std": [0.26862954, 0.26130258, 0.27577711], "do_convert_rgb": True,
}  # fmt: skip


@dataclass(frozen=True)
class ImageEncoder:
    """A CLIP vision tower (frozen) and its image processor."""

    model: torch.nn.Module
    processor: object

    @property
    def width(self) -> int:
        """The states' width (the tower's hidden size)."""
        return self.model.config.hidden_size

    def tokens(self) -> int:
        """How many states an image gives: the class token and the patches."""
        config = self.model.config
        return (config.image_size // config.patch_size) ** 2 + 1

    def states(self, images: list[Image.Image], device: torch.device) -> torch.Tensor:
        """The penultimate hidden states [B, T, hidden] of ``images`` (RGB), in the tower's
        dtype on ``device``; on the meta device (the dry run's estimate) an empty tensor of that
        shape."""
        weight = next(self.model.parameters())
        if weight.is_meta:
            shape = (len(images), self.tokens(), self.width)
            return torch.empty(shape, device="meta", dtype=weight.dtype)
        inputs = self.processor(images=images, return_tensors="pt").to(weight.device)
        out = self.model(pixel_values=inputs["pixel_values"].to(weight.dtype),
                         output_hidden_states=True)  # fmt: skip
        return out.hidden_states[-2].to(device)

    def pixel_states(self, pixels: torch.Tensor, device: torch.device) -> torch.Tensor:
        """``states`` of training pixels [B, 3, H, W] in [-1, 1] (module docstring)."""
        if pixels.is_meta:
            return self.states([None] * pixels.shape[0], device)
        return self.states(pixel_images(pixels), device)


def pixel_images(pixels: torch.Tensor) -> list[Image.Image]:
    """The 8-bit RGB images of pixels [B, 3, H, W] in [-1, 1]."""
    levels = ((pixels.detach().float().cpu() + 1) * 127.5).round().clamp(0, 255)
    arrays = levels.to(torch.uint8).permute(0, 2, 3, 1).numpy()
    return [Image.fromarray(np.ascontiguousarray(a)) for a in arrays]


def clip_processor(config: dict | None = None):
    """transformers' CLIPImageProcessor with ``config`` (None: the released CLIP_PROCESSOR),
    the class diffusers reads a folder's image_processor/ with."""
    from transformers import CLIPImageProcessor

    return CLIPImageProcessor(**(config or CLIP_PROCESSOR))


def folder_processor(folder) -> object:
    """The CLIPImageProcessor of a pipeline folder's image_processor/ (as diffusers loads it)."""
    from transformers import CLIPImageProcessor

    return CLIPImageProcessor.from_pretrained(str(folder))
