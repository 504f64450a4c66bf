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

Pixel values. Every mode Pillow opens becomes 8-bit RGB, plus an 8-bit alpha where the file has
one, before anything else happens (rgb_and_alpha):
- 8-bit modes use Pillow's conversion: "1" is 0 or 255; "L" grey; "P" its palette; "RGBX" drops
  X; "CMYK" is (255 - C)(255 - K) / 255 per channel; "YCbCr" JPEG's (JFIF) formula; "HSV" the
  usual hexcone.
- "LAB" (TIFF's CIELab: D50 white, a and b signed) goes to sRGB through LittleCMS without its
  optimised lookup table: Pillow's own conversion uses that table and is up to 20 steps off in
  dark colours.
- 16-bit grey ("I;16", "I;16B", "I;16L", "I;16N"; a 16-bit grey PNG opens as "I;16") and 32-bit
  integer grey ("I": 16-bit PGM, integer TIFF) hold 0..65535: v becomes round(v / 65535 * 255).
  An "I" pixel outside 0..65535 is an error: the file's range is unknown, and clipping (what
  Pillow's own conversion does) would train a white image.
- Float grey ("F", TIFF) is taken as 0..1: v becomes round(clip(v, 0, 1) * 255); a NaN pixel is
  an error.
- 16 bits per colour channel (RGB and RGBA PNG or TIFF, 16-bit grey+alpha PNG): Pillow opens
  these as 8-bit "RGB" / "RGBA" keeping each value's high byte, v // 256, which is within one
  8-bit step of round(v / 65535 * 255).
- Alpha is kept for "LA", "La", "PA", "RGBA", "RGBa", palettes with transparency and colour keys
  (a PNG/GIF "transparency" on "1", "L", "P", "RGB" or 16-bit grey). Premultiplied modes ("La",
  "RGBa") are un-premultiplied before compositing. Two Pillow gaps are closed here: the colour key
  of a 2- or 4-bit grey PNG is scaled like its pixels, and the 16-bit key of a 16-bit RGB PNG is
  matched on its high bytes (the only ones Pillow keeps), so colours within 1/256 of the key are
  transparent too.
- Animated or multi-frame files (GIF, WebP, APNG, multi-page TIFF) train their first frame;
  read_image_header counts the frames so the plan can say so. A camera JPEG holding several
  pictures (MPO: a preview or stereo pair) is not counted: its first picture is the photo.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from PIL import Image, ImageCms, ImageOps

from library.data.augment import AugmentDraws, shift_hue
from library.data.header_read import ImageHeader as ImageHeader
from library.data.header_read import PixelValueError as PixelValueError
from library.data.header_read import (
    _check_not_a_path_problem,
    _grey_levels,
    _unreadable,
    read_image_header,
)

_PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
_SIXTEEN_BIT_GREY = ("I;16", "I;16B", "I;16L", "I;16N")
_WIDE_GREY = ("I", "F", *_SIXTEEN_BIT_GREY)  # modes Pillow's 8-bit conversions clip


def check_image(path: Path) -> tuple[int, int]:
    """(width, height) of the image as displayed (EXIF orientation applied), from its header.

    Raises DataError naming the file if it is missing or not a usable image (read_image_header).
    """
    return read_image_header(path).size


def _on_white(rgba: Image.Image) -> Image.Image:
    background = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
    return Image.alpha_composite(background, rgba).convert("RGB")


def _wide_grey(image: Image.Image) -> tuple[Image.Image, Image.Image | None]:
    values = np.asarray(image)
    levels = _grey_levels(values, image.mode)
    grey = Image.fromarray(np.floor(levels + 0.5).astype(np.uint8))
    key = image.info.get("transparency")
    if key is None:
        return grey.convert("RGB"), None
    alpha = Image.fromarray(np.where(values == key, 0, 255).astype(np.uint8))
    return _on_white(Image.merge("LA", (grey, alpha)).convert("RGBA")), alpha


def _corrected_key(image: Image.Image, png_bit_depth: int | None) -> Image.Image:
    """`image` with its PNG colour key in the units of its pixels (module docstring)."""
    key = image.info.get("transparency")
    if key is None or png_bit_depth is None:
        return image
    if image.mode == "L" and png_bit_depth < 8:
        key = key * 255 // (2**png_bit_depth - 1)
    elif image.mode == "RGB" and png_bit_depth == 16:
        key = tuple(value >> 8 for value in key)
    else:
        return image
    image = image.copy()
    image.info["transparency"] = key
    return image


@functools.cache
def _lab_to_srgb() -> ImageCms.ImageCmsTransform:
    return ImageCms.buildTransform(
        ImageCms.createProfile("LAB"),
        ImageCms.createProfile("sRGB"),
        "LAB",
        "RGB",
        flags=ImageCms.Flags.NOOPTIMIZE,  # exact to rounding (module docstring)
    )


def rgb_and_alpha(
    image: Image.Image, png_bit_depth: int | None = None
) -> tuple[Image.Image, Image.Image | None]:
    """`image` of any Pillow mode as 8-bit "RGB", alpha composited on white, and its alpha ("L")
    or None if it has none. The value mapping of each mode is in the module docstring.

    `png_bit_depth` is the bit depth in the PNG header of the file `image` came from, if it is a
    PNG (it fixes the colour keys Pillow leaves in the file's units). Raises PixelValueError for
    pixel values without a defined meaning.
    """
    if image.mode in _WIDE_GREY:
        return _wide_grey(image)
    if image.mode == "LAB":  # Pillow has no LAB with alpha
        return ImageCms.applyTransform(image, _lab_to_srgb()), None
    image = _corrected_key(image, png_bit_depth)
    if not image.has_transparency_data:  # alpha modes, RGBA palettes, colour keys
        return image.convert("RGB"), None
    if image.mode == "La":  # Pillow converts premultiplied grey only to "LA"
        image = image.convert("LA")
    rgba = image.convert("RGBA")
    return _on_white(rgba), rgba.getchannel("A")


def _png_bit_depth(path: Path) -> int | None:
    """The bit depth in the IHDR chunk of a PNG file (Pillow does not expose it), else None."""
    with open(path, "rb") as file:
        head = file.read(26)
    if len(head) < 26 or head[:8] != _PNG_SIGNATURE or head[12:16] != b"IHDR":
        return None
    return head[24]


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
    """The displayed image (its first frame) as RGB (alpha composited on white) and its alpha
    ("L") if it has one."""
    _check_not_a_path_problem(path)
    try:
        with Image.open(path) as opened:
            keyed_png = opened.format == "PNG" and "transparency" in opened.info
            depth = _png_bit_depth(path) if keyed_png else None
            return rgb_and_alpha(ImageOps.exif_transpose(opened), depth)
    except Exception as error:  # PIL raises many types for corrupt or truncated files
        raise _unreadable(path, error) from error


def load_display_image(path: Path) -> Image.Image:
    """The image at ``path`` as it is displayed (RGB, alpha on white, EXIF orientation applied),
    at its own size: what sample grids show beside a result. DataError naming an unreadable
    file."""
    return _open(Path(path))[0]


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
