"""Reading training images: checked up front, loaded as [-1, 1] tensors at the training size.

Decisions:
- The EXIF orientation is applied, so an image is trained the way viewers show it (kohya ignores
  it, which trains phone photos sideways).
- Transparent pixels are composited on white. Their RGB values are undefined (often black, often
  leftovers of editing), so dropping alpha as kohya does trains on invisible data; white is what
  such images usually look like on a page.
- Resizing keeps the aspect ratio and covers the target, then the center is cropped. The filter is
  PIL's LANCZOS, which is antialiased when shrinking (its kernel widens with the scale) and sharp
  when enlarging. An image already at the target size is not resampled.
- For training (load_training_image) the crop may sit anywhere in the slack (random_crop), the
  crop is then flipped and hue-shifted as the sample's AugmentDraws say. The alpha channel, when
  asked for (alpha-mask loss), follows the same geometry; it is resized with BILINEAR, whose
  non-negative kernel keeps it within [0, 1].
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from PIL import Image, ImageOps

from library.data.augment import AugmentDraws, shift_hue
from library.errors import DataError

_ORIENTATION = 0x0112
_TRANSPOSED_ORIENTATIONS = frozenset({5, 6, 7, 8})  # stored rotated by 90 degrees


def _unreadable(path: Path, error: Exception) -> DataError:
    return DataError(f"image {path} cannot be read ({error}); replace or remove the file")


def check_image(path: Path) -> tuple[int, int]:
    """(width, height) of the image as displayed (EXIF orientation applied), from its header.

    Also verifies the file's structure where the format allows it cheaply (e.g. PNG checksums).
    Raises DataError naming the file if it is missing or not a readable image.
    """
    try:
        with Image.open(path) as image:
            width, height = image.size
            # PIL decodes a whole PNG to look for an EXIF chunk after the pixel data; such files
            # are rare enough that only an EXIF chunk before the pixels is honoured here.
            has_exif = image.format != "PNG" or "exif" in image.info
            if has_exif and image.getexif().get(_ORIENTATION) in _TRANSPOSED_ORIENTATIONS:
                width, height = height, width
        with Image.open(path) as image:  # verify() must come right after open
            image.verify()
    except Exception as error:  # PIL raises many types (OSError, SyntaxError, struct.error, ...)
        raise _unreadable(path, error) from error
    return width, height


def _has_alpha(image: Image.Image) -> bool:
    return image.mode in ("RGBA", "LA", "PA", "RGBa", "La") or (
        image.mode == "P" and "transparency" in image.info
    )


def _to_rgb(image: Image.Image) -> Image.Image:
    if not _has_alpha(image):
        return image.convert("RGB")
    rgba = image.convert("RGBA")
    background = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
    return Image.alpha_composite(background, rgba).convert("RGB")


def cover_geometry(
    image_size: tuple[int, int], size: tuple[int, int]
) -> tuple[tuple[int, int], tuple[int, int]]:
    """((new_w, new_h), (left, top)): the covering resize of an `image_size` (w, h) image for
    `size` (w, h) keeping the aspect ratio, and the top-left corner of the center crop in the
    resized image's pixels."""
    target_w, target_h = size
    width, height = image_size
    scale = max(target_w / width, target_h / height)
    new_w = max(target_w, round(width * scale))
    new_h = max(target_h, round(height * scale))
    return (new_w, new_h), ((new_w - target_w) // 2, (new_h - target_h) // 2)


def cover_and_crop(image: Image.Image, size: tuple[int, int]) -> Image.Image:
    """Resize `image` keeping its aspect ratio so it covers `size` (w, h), then crop the center."""
    (new_w, new_h), (left, top) = cover_geometry(image.size, size)
    if (new_w, new_h) != image.size:
        image = image.resize((new_w, new_h), Image.Resampling.LANCZOS)
    return image.crop((left, top, left + size[0], top + size[1]))


def load_image(path: Path, size: tuple[int, int]) -> torch.Tensor:
    """The image at `path` as float32 [3, H, W] in [-1, 1] for `size` = (W, H).

    RGB (alpha composited on white), EXIF orientation applied, resized to cover and center-cropped.
    Raises DataError naming the file if it cannot be decoded.
    """
    return load_image_with_sizes(path, size)[0]


def load_image_with_sizes(
    path: Path, size: tuple[int, int]
) -> tuple[torch.Tensor, tuple[int, int], tuple[int, int]]:
    """``load_image`` plus what SDXL's size conditioning needs: the source image's (height,
    width) as displayed, and the (top, left) of the crop in the resized image's pixels (as SDXL
    and diffusers' SDXL training count them)."""
    loaded = load_training_image(path, size)
    return loaded.pixels, loaded.original_size, loaded.crop_top_left


def crop_geometry(
    image_size: tuple[int, int],
    size: tuple[int, int],
    crop_fraction: tuple[float, float] | None = None,
) -> tuple[tuple[int, int], tuple[int, int]]:
    """((new_w, new_h), (left, top)) like cover_geometry, with the crop placed at
    `crop_fraction` = (x, y) in [0, 1] of the slack instead of the center when given.

    Fraction f picks offset min(slack, floor(f * (slack + 1))): a uniform f gives every one of
    the slack + 1 offsets equal odds, 0 the top/left edge and 1 the bottom/right edge.
    """
    (new_w, new_h), center = cover_geometry(image_size, size)
    if crop_fraction is None:
        return (new_w, new_h), center
    offsets = []
    for fraction, slack in zip(crop_fraction, (new_w - size[0], new_h - size[1]), strict=True):
        if not 0 <= fraction <= 1:
            raise ValueError(f"crop fraction {fraction} is outside [0, 1]")
        offsets.append(min(slack, int(fraction * (slack + 1))))
    return (new_w, new_h), (offsets[0], offsets[1])


@dataclass(frozen=True)
class LoadedImage:
    """A training image: pixels float32 [3, H, W] in [-1, 1]; alpha float32 [1, H, W] in [0, 1]
    (None unless asked for); the source's (height, width) as displayed; the crop's (top, left)
    in the resized image's pixels, measured from the left edge the model sees (after a flip)."""

    pixels: torch.Tensor
    alpha: torch.Tensor | None
    original_size: tuple[int, int]
    crop_top_left: tuple[int, int]


def _open(path: Path) -> tuple[Image.Image, Image.Image | None]:
    """The displayed image as RGB (alpha composited on white) and its alpha ("L") if it has one."""
    try:
        with Image.open(path) as opened:
            image = ImageOps.exif_transpose(opened)
            alpha = image.convert("RGBA").getchannel("A") if _has_alpha(image) else None
            return _to_rgb(image), alpha
    except Exception as error:  # PIL raises many types for corrupt or truncated files
        raise _unreadable(path, error) from error


def _resize_crop(
    image: Image.Image, resized: tuple[int, int], box: tuple[int, int, int, int], resample: int
) -> Image.Image:
    if resized != image.size:
        image = image.resize(resized, resample)
    return image.crop(box)


def load_training_image(
    path: Path,
    size: tuple[int, int],
    draws: AugmentDraws | None = None,
    with_alpha: bool = False,
) -> LoadedImage:
    """The image at `path` at training `size` = (W, H): covered, cropped (center, or at
    draws.crop_fraction), flipped horizontally if draws.flip, hue-shifted by draws.hue_shift.

    With `with_alpha` the alpha channel goes through the same crop and flip (all ones for an image
    without alpha). Raises DataError naming the file if it cannot be decoded.
    """
    image, alpha = _open(path)
    original = (image.height, image.width)
    resized, (left, top) = crop_geometry(image.size, size, draws.crop_fraction if draws else None)
    box = (left, top, left + size[0], top + size[1])
    rgb = np.asarray(_resize_crop(image, resized, box, Image.Resampling.LANCZOS), dtype=np.uint8)
    pixels = torch.from_numpy(rgb.copy()).permute(2, 0, 1).float()
    mask = None
    if with_alpha and alpha is None:
        mask = torch.ones(1, size[1], size[0])
    elif with_alpha:
        cropped = _resize_crop(alpha, resized, box, Image.Resampling.BILINEAR)
        mask = torch.from_numpy(np.asarray(cropped, dtype=np.uint8).copy())[None].float() / 255
    if draws is not None and draws.flip:
        pixels = pixels.flip(-1)
        mask = None if mask is None else mask.flip(-1)
        left = resized[0] - left - size[0]
    if draws is not None and draws.hue_shift != 0:
        pixels = shift_hue(pixels, draws.hue_shift)
    return LoadedImage(pixels / 127.5 - 1.0, mask, original, (top, left))
