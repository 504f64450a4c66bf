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
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from PIL import Image, ImageOps

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


def _to_rgb(image: Image.Image) -> Image.Image:
    has_alpha = image.mode in ("RGBA", "LA", "PA", "RGBa", "La") or (
        image.mode == "P" and "transparency" in image.info
    )
    if not has_alpha:
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
    try:
        with Image.open(path) as opened:
            image = ImageOps.exif_transpose(opened)
            image = _to_rgb(image)
    except Exception as error:  # PIL raises many types for corrupt or truncated files
        raise _unreadable(path, error) from error
    original = (image.height, image.width)
    _, (left, top) = cover_geometry(image.size, size)
    pixels = np.asarray(cover_and_crop(image, size), dtype=np.uint8)
    tensor = torch.from_numpy(pixels.copy()).permute(2, 0, 1).float()
    return tensor / 127.5 - 1.0, original, (top, left)
