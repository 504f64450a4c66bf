"""Qwen2.5-VL's input processing for a caption with images, as transformers' Qwen2VLProcessor
does it, without its video half (which needs torchvision to be constructed at all).

The facts (transformers' Qwen2VLProcessor and Qwen2VLImageProcessor):

- the image processor resizes each image to a multiple of 28 pixels (14-pixel patches merged
  2x2) within its min/max pixel counts, normalises it with CLIP's mean and std and cuts it into
  patches: ``pixel_values`` [patches, 3 * 2 * 14 * 14] and ``image_grid_thw`` [images, 3]
  (frames, rows, columns of patches);
- in the text, each ``<|image_pad|>`` stands for one image, in order: it is repeated
  rows * columns / 4 times (one token per merged 2x2 patch) before tokenizing;
- the texts are tokenized together, padded to the longest.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from library.errors import ModelError

IMAGE_PAD = "<|image_pad|>"
_HELD = "\x00image\x00"  # stands for an expanded pad while the others are found


class VisionTextProcessor:
    """A Qwen2.5-VL tokenizer and image processor, called like Qwen2VLProcessor."""

    def __init__(self, tokenizer, image_processor):
        self.tokenizer = tokenizer
        self.image_processor = image_processor

    def __getattr__(self, name):
        # the tokenizer's facts (special ids, vocabulary), which the text cache's identity reads
        if name in ("tokenizer", "image_processor"):
            raise AttributeError(name)
        return getattr(self.tokenizer, name)

    @property
    def cache_settings(self) -> dict:
        """The image processor's settings: they change what the text encoder reads."""
        return self.image_processor.to_dict()

    def __call__(self, text: Sequence[str], images: Sequence, padding=True, return_tensors="pt"):
        """input_ids, attention_mask, pixel_values and image_grid_thw of ``text`` with one
        ``<|image_pad|>`` per image of ``images`` (in order)."""
        from transformers import BatchFeature

        pictures = self.image_processor(images=list(images), return_tensors=return_tensors)
        grids = pictures["image_grid_thw"]
        merged = self.image_processor.merge_size**2
        expanded, index = [], 0
        for line in text:
            while IMAGE_PAD in line:
                if index >= len(grids):
                    raise ValueError("more <|image_pad|> tokens in the texts than images")
                line = line.replace(IMAGE_PAD, _HELD * (int(grids[index].prod()) // merged), 1)
                index += 1
            expanded.append(line.replace(_HELD, IMAGE_PAD))
        if index != len(grids):
            raise ValueError(f"{len(grids)} images for {index} <|image_pad|> tokens")
        tokens = self.tokenizer(expanded, padding=padding, return_tensors=return_tensors)
        return BatchFeature({**tokens, **pictures})


# The files holding Qwen2.5-VL's image processor settings, either of which transformers reads:
# the image processor's own (what the released processor/ folders hold), and the whole
# processor's with the image processor's settings inside (what transformers 5 saves).
SETTINGS_FILES = ("preprocessor_config.json", "processor_config.json")


def holds_settings(folder: Path) -> bool:
    """``folder`` holds Qwen2.5-VL's image processor settings (one of SETTINGS_FILES)."""
    return any((folder / name).is_file() for name in SETTINGS_FILES)


def read_processor(folder: Path, tokenizer) -> VisionTextProcessor:
    """The processor of a Qwen-Image-Edit folder's processor/ (its preprocessor_config.json or
    processor_config.json) with ``tokenizer``; ModelError when it cannot be read."""
    from transformers import Qwen2VLImageProcessorPil

    if not holds_settings(folder):
        raise ModelError(
            f"{folder} has neither {' nor '.join(SETTINGS_FILES)} (Qwen2.5-VL's image processor "
            "settings); the diffusers folder is incomplete"
        )

    try:
        image_processor = Qwen2VLImageProcessorPil.from_pretrained(
            str(folder), local_files_only=True
        )
    except (OSError, ValueError) as exc:
        raise ModelError(f"cannot read the Qwen2.5-VL image processor in {folder}: {exc}") from None
    return VisionTextProcessor(tokenizer, image_processor)
