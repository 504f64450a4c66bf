"""Reading an image's header for the scan: its displayed size and frame count, its structure
checked, in one open (library.data.images loads the pixels).

Decisions: see library.data.images (EXIF orientation, 32-bit and float grey ranges, frames). This
module imports no torch, so that a header worker process (library.data.header_workers) starts in
a fraction of a second.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import NamedTuple

import numpy as np
from PIL import Image

from library.errors import DataError

_ORIENTATION = 0x0112
_TRANSPOSED_ORIENTATIONS = frozenset({5, 6, 7, 8})  # stored rotated by 90 degrees
_MAX_16_BIT = 65535


class PixelValueError(ValueError):
    """An image's pixel values have no defined 8-bit meaning; the message ends with the fix."""


def _unreadable(path: Path | str, error: Exception) -> DataError:
    if isinstance(error, PixelValueError):
        return DataError(f"image {path} {error}")
    return DataError(f"image {path} cannot be read ({error}); replace or remove the file")


class ImageHeader(NamedTuple):
    """What a scan needs to know about an image file (a tuple: one is made per image)."""

    size: tuple[int, int]  # (width, height) as displayed (EXIF orientation applied)
    frames: int  # animation frames or pages; only the first is trained

    @property
    def animated(self) -> bool:
        return self.frames > 1


def _check_not_a_path_problem(path: Path | str, mode: int | None = None) -> None:
    """Name the path problem itself where PIL would only say "No such file" or "Is a directory",
    or would wait forever (a FIFO). One stat on the scan's path for every image (none when the
    caller's stat gives its ``mode``); a missing or unreadable path is left to PIL's open, whose
    error names it."""
    if mode is None:
        try:
            mode = os.stat(path).st_mode
        except FileNotFoundError:
            if os.path.islink(path):
                raise DataError(
                    f"image {path} is a link to {os.readlink(path)}, which does not exist; "
                    "fix or remove the link"
                ) from None
            return
        except OSError:
            return
    if stat.S_ISDIR(mode):
        raise DataError(f"image {path} is a folder, not an image file; rename or remove it")
    if not stat.S_ISREG(mode):
        # a FIFO or a device would block or never end when opened; say so instead of hanging
        raise DataError(
            f"image {path} is not a regular file (a pipe, device or socket); replace it with an "
            "image file or remove it"
        )


def _frames(image: Image.Image) -> int:
    if image.format == "MPO":  # a camera's extra pictures (preview, stereo), not an animation
        return 1
    return getattr(image, "n_frames", 1)


def read_image_header(path: Path | str, mode: int | None = None) -> ImageHeader:
    """The displayed size and the frame count of the image at `path`, read from its header.

    Also verifies the file's structure where the format allows it cheaply (e.g. PNG checksums),
    and the value range of 32-bit integer and float images (see the module docstring). Raises
    DataError naming the file if it is missing, a broken link or not a usable image. ``mode``:
    the file's st_mode when the caller has just stat'ed it (saves a stat).

    The file is opened once: verify() reads only what the header read left (PNG seeks back to
    its first image chunk itself; other formats check nothing there). Only a 32-bit image, whose
    pixels are read for their range, is opened a second time to verify.
    """
    _check_not_a_path_problem(path, mode)
    try:
        with Image.open(path) as image:
            width, height = image.size
            # PIL decodes a whole PNG to look for an EXIF chunk after the pixel data; such files
            # are rare enough that only an EXIF chunk before the pixels is honoured here.
            has_exif = image.format != "PNG" or "exif" in image.info
            if has_exif and image.getexif().get(_ORIENTATION) in _TRANSPOSED_ORIENTATIONS:
                width, height = height, width
            frames = _frames(image)
            wide = image.mode in ("I", "F")  # rare modes whose range only the pixels show
            if wide:
                _grey_levels(np.asarray(image), image.mode)
            else:
                image.verify()
        if wide:
            with Image.open(path) as image:  # verify() must come before the pixels are read
                image.verify()
    except Exception as error:  # PIL raises many types (OSError, SyntaxError, struct.error, ...)
        raise _unreadable(path, error) from error
    return ImageHeader((width, height), frames)


def _grey_levels(values: np.ndarray, mode: str) -> np.ndarray:
    """The 0..255 float levels of a wide grey image's pixel values (module docstring)."""
    if mode == "F":
        if np.isnan(values).any():
            raise PixelValueError(
                "has NaN (not-a-number) pixels; save it with 8 or 16 bits per channel"
            )
        return np.clip(values, 0.0, 1.0).astype(np.float64) * 255
    if mode == "I" and values.size and (values.min() < 0 or values.max() > _MAX_16_BIT):
        raise PixelValueError(
            f"has 32-bit pixel values from {values.min()} to {values.max()}, outside "
            f"0..{_MAX_16_BIT}; save it with 8 or 16 bits per channel"
        )
    return values.astype(np.float64) * (255 / _MAX_16_BIT)
