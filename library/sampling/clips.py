"""Sample clips: a prompt with several frames is written as a short animation and a frame strip.

The animation plays at the family's frame rate: an animated WebP (lossless, so its frames are the
sampled pixels exactly; browsers and most image viewers play it) or, where the run asks, an MP4
(H.264 through PyAV). The strip puts a few frames, first to last, side by side in one PNG, so the
motion shows in any image viewer, in the round's grid and in the trackers. Both are written to a
temporary beside their place and moved there, so a file a round writes is whole or absent.
"""

from __future__ import annotations

from fractions import Fraction
from pathlib import Path

import av
import numpy as np
from PIL import Image

from library.sampling.grid import side_by_side, strip_path
from library.saving.atomic import atomic_write_file

CLIP_FORMATS = ("webp", "mp4")
STRIP_FRAMES = 4  # frames a strip shows: enough to see motion, few enough to see each one
MP4_CODECS = ("libx264", "h264", "mpeg4")  # the first one the installed PyAV encodes
MP4_QUALITY = "16"  # x264's constant rate factor: near-lossless at a sample's small size


def round_frames(frames: int, frame_factor: int) -> int:
    """A prompt's frame count as the family's VAE takes it: 1 + a multiple of ``frame_factor``,
    rounded down (musubi-tuner's rule for its sample prompts); an image family's stays."""
    if frames <= 1 or frame_factor <= 0:
        return frames
    return 1 + (frames - 1) // frame_factor * frame_factor


def strip_indices(count: int, shown: int = STRIP_FRAMES) -> list[int]:
    """Which of ``count`` frames a strip shows: ``shown`` of them evenly spaced, the first and
    the last included (all of them when there are fewer)."""
    if count <= shown:
        return list(range(count))
    return [round(i * (count - 1) / (shown - 1)) for i in range(shown)]


def frame_strip(frames: list[Image.Image]) -> Image.Image:
    """The strip of a clip: its strip_indices frames left to right, pixels unchanged."""
    return side_by_side([frames[i] for i in strip_indices(len(frames))])


def write_clip(path: Path, frames: list[Image.Image], fps: float) -> tuple[Path, Path]:
    """Write ``frames`` as the clip ``path`` (.webp or .mp4) playing at ``fps``, and its frame
    strip (strip_path); both atomically. Returns (clip, strip)."""
    writers = {".webp": _write_webp, ".mp4": _write_mp4}
    write = writers[path.suffix]
    atomic_write_file(path, lambda tmp: write(tmp, frames, fps))
    strip = strip_path(path)
    atomic_write_file(strip, lambda tmp: frame_strip(frames).save(tmp, format="PNG"))
    return path, strip


def _write_webp(tmp: Path, frames: list[Image.Image], fps: float) -> None:
    rgb = [frame.convert("RGB") for frame in frames]
    rgb[0].save(
        tmp, format="WEBP", save_all=True, append_images=rgb[1:], lossless=True,
        duration=round(1000 / fps), loop=0,
    )  # fmt: skip


def _write_mp4(tmp: Path, frames: list[Image.Image], fps: float) -> None:
    codec = next(name for name in MP4_CODECS if name in av.codecs_available)
    with av.open(str(tmp), mode="w", format="mp4") as container:
        stream = container.add_stream(codec, rate=Fraction(fps).limit_denominator(1001))
        stream.width, stream.height = frames[0].size
        stream.pix_fmt = "yuv420p"
        if codec == "libx264":
            stream.options = {"crf": MP4_QUALITY}
        for frame in frames:
            picture = av.VideoFrame.from_ndarray(np.asarray(frame.convert("RGB")), format="rgb24")
            container.mux(stream.encode(picture))
        container.mux(stream.encode())
