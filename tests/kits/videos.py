"""Tiny test videos, encoded here with PyAV: every container the data path reads, and the broken
and unusual files it must name or handle.

Each frame of a numbered clip (numbered_frames) is one flat colour that encodes its index (red
and green in steps of COLOUR_STEP, coarse enough to survive lossy codecs and GIF's 3-3-2
palette), with a white MARKER-pixel square in its top-left corner as stored, so a test can read
back which frame it got (frame_index) and how it was turned (marker_corner).

moving_square makes a clip with motion (a square crossing the frame), for learning checks.
"""

from __future__ import annotations

import fractions
from collections.abc import Sequence
from pathlib import Path

import av
import numpy as np
from PIL import Image

COLOUR_STEP = 36  # GIF's rgb8 palette has 8 levels per colour: 0, 36, 73, ..., 255
LEVELS = 8
MARKER = 8  # side of the white square in the stored top-left corner
SIZE = (48, 32)  # (width, height): even sides for 4:2:0 chroma
# container extension -> (PyAV codec, pixel format)
CODECS = {
    ".mp4": ("libx264", "yuv420p"),
    ".mov": ("mpeg4", "yuv420p"),
    ".mkv": ("libx264", "yuv420p"),
    ".webm": ("libvpx-vp9", "yuv420p"),
    ".gif": ("gif", "rgb8"),
}


def frame_colour(index: int) -> tuple[int, int, int]:
    """The flat colour of frame ``index`` of a numbered clip (up to LEVELS**2 frames)."""
    if not 0 <= index < LEVELS * LEVELS:
        raise ValueError(f"a numbered clip has at most {LEVELS * LEVELS} frames")
    return (_level(index % LEVELS), _level(index // LEVELS), 128)


def _level(step: int) -> int:
    return min(255, step * COLOUR_STEP + (step == LEVELS - 1) * 3)


def numbered_frames(count: int, size: tuple[int, int] = SIZE) -> np.ndarray:
    """``count`` frames uint8 [F, H, W, 3], frame i coloured frame_colour(i), with the white
    marker in the top-left corner."""
    width, height = size
    frames = np.empty((count, height, width, 3), np.uint8)
    for index in range(count):
        frames[index] = frame_colour(index)
    frames[:, :MARKER, :MARKER] = 255
    return frames


def frame_index(frame: np.ndarray) -> int:
    """The index a decoded numbered frame encodes, read from its colour away from the marker
    (the median, so codec ringing at edges does not matter)."""
    height, width = frame.shape[:2]
    centre = frame[height // 4 :, width // 4 :].reshape(-1, 3)
    red, green = (int(np.median(centre[:, c])) for c in (0, 1))
    return round(min(red, 252) / COLOUR_STEP) + LEVELS * round(min(green, 252) / COLOUR_STEP)


def marker_corner(frame: np.ndarray) -> str:
    """Which corner of a decoded numbered frame holds the white marker: "top-left",
    "top-right", "bottom-left" or "bottom-right"."""
    height, width = frame.shape[:2]
    corners = {
        "top-left": frame[:MARKER, :MARKER],
        "top-right": frame[:MARKER, width - MARKER :],
        "bottom-left": frame[height - MARKER :, :MARKER],
        "bottom-right": frame[height - MARKER :, width - MARKER :],
    }
    return max(corners, key=lambda name: int(corners[name].astype(np.int64).sum()))


def moving_square(
    count: int, size: tuple[int, int] = SIZE, side: int = 8, reverse: bool = False
) -> np.ndarray:
    """``count`` frames uint8 [F, H, W, 3] of a white square moving left to right across a grey
    background (right to left with ``reverse``): a clip whose content is its motion."""
    width, height = size
    frames = np.full((count, height, width, 3), 64, np.uint8)
    top = (height - side) // 2
    for index in range(count):
        step = index if not reverse else count - 1 - index
        left = round(step * (width - side) / max(count - 1, 1))
        frames[index, top : top + side, left : left + side] = 255
    return frames


def write_video(
    path: Path,
    frames: np.ndarray,
    fps: int = 8,
    *,
    times: Sequence[float] | None = None,
    rotation: int | None = None,
    faststart: bool = False,
    codec: str | None = None,
    pixel_aspect: fractions.Fraction | None = None,
    keyframe_every: int | None = None,
) -> Path:
    """Encode ``frames`` (uint8 [F, H, W, 3]) to ``path`` with the codec its extension takes
    (CODECS). ``times``: each frame's presentation time in seconds (a variable frame rate);
    ``rotation``: the display matrix's counter-clockwise angle (FFmpeg's convention);
    ``faststart``: mp4/mov with the index before the frames; ``codec``: another PyAV encoder
    than the container's usual one (e.g. "libvpx" for VP8 in webm); ``pixel_aspect``: the
    width of a pixel over its height (anamorphic video); ``keyframe_every``: the most frames
    from one keyframe to the next (the encoder's own default otherwise)."""
    path = Path(path)
    usual, pixel_format = CODECS[path.suffix.lower()]
    codec = codec or usual
    options = {"movflags": "faststart"} if faststart else {}
    with av.open(str(path), "w", options=options) as container:
        stream = container.add_stream(codec, rate=fps)
        stream.width, stream.height = frames.shape[2], frames.shape[1]
        stream.pix_fmt = pixel_format
        if times is not None:
            stream.codec_context.time_base = fractions.Fraction(1, 1000)
        if rotation is not None:
            stream.set_display_rotation(rotation)
        if pixel_aspect is not None:
            stream.codec_context.sample_aspect_ratio = pixel_aspect
        if keyframe_every is not None:
            stream.codec_context.gop_size = keyframe_every
        for index, pixels in enumerate(frames):
            frame = av.VideoFrame.from_ndarray(np.ascontiguousarray(pixels), format="rgb24")
            if times is not None:
                frame.pts, frame.time_base = round(times[index] * 1000), fractions.Fraction(1, 1000)
            container.mux(stream.encode(frame))
        container.mux(stream.encode())
    return path


def write_frame_folder(folder: Path, frames: np.ndarray, name: str = "frame{}.png") -> Path:
    """``frames`` as PNG files in ``folder``, numbered without zero padding (frame1 ..
    frame12) so that only natural order puts them in sequence."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    for index, pixels in enumerate(frames):
        Image.fromarray(pixels).save(folder / name.format(index + 1))
    return folder


def write_zero_frames(path: Path) -> Path:
    """A container with a video stream and no frame in it."""
    path = Path(path)
    codec, pixel_format = CODECS[path.suffix.lower()]
    with av.open(str(path), "w") as container:
        stream = container.add_stream(codec, rate=8)
        stream.width, stream.height = SIZE
        stream.pix_fmt = pixel_format
        container.start_encoding()
    return path


def write_truncated(path: Path, frames: int = 40, keep: float = 0.6) -> Path:
    """A numbered clip cut after ``keep`` of its bytes, as a broken download leaves it. An mp4
    or mov keeps its index at the front (faststart), so the container still opens and still
    promises every frame."""
    path = Path(path)
    write_video(path, numbered_frames(frames), faststart=path.suffix.lower() in (".mp4", ".mov"))
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * keep)])
    return path


def write_corrupt(path: Path, frames: int = 9) -> Path:
    """A numbered clip with 400 bytes of noise written over its middle: the container opens,
    the frames do not decode."""
    path = Path(path)
    write_video(path, numbered_frames(frames))
    data = bytearray(path.read_bytes())
    start = len(data) // 3
    data[start : start + 400] = np.random.default_rng(0).integers(0, 256, 400, np.uint8).tobytes()
    path.write_bytes(bytes(data))
    return path


def write_corrupt_middle(path: Path, frames: int = 48, group: int = 8) -> Path:
    """A numbered mp4 or mov clip with a keyframe every ``group`` frames whose middle group's
    frame data (after each packet's first 5 bytes: its length and NAL or start code) is noise.
    The container, its index and the packets' timestamps are intact; only decoding those
    frames finds the damage."""
    path = Path(path)
    write_video(path, numbered_frames(frames), keyframe_every=group)
    with av.open(str(path)) as container:
        stream = container.streams.video[0]
        packets = [(p.pos, p.size, p.is_keyframe) for p in container.demux(stream) if p.size]
    keys = [index for index, (_, _, key) in enumerate(packets) if key]
    start = keys[len(keys) // 2]
    end = next((k for k in keys if k > start), len(packets))
    data = bytearray(path.read_bytes())
    noise = np.random.default_rng(0)
    for position, size, _ in packets[start:end]:
        data[position + 5 : position + size] = noise.integers(0, 256, size - 5, np.uint8).tobytes()
    path.write_bytes(bytes(data))
    return path


def write_not_a_video(path: Path) -> Path:
    """A text file under a video's name."""
    path = Path(path)
    path.write_text("this is not a video\n")
    return path


def write_size_change(path: Path, frames: int = 4) -> Path:
    """An MPEG transport stream whose frames change size halfway (two streams of different
    sizes, one after the other, as joined recordings are: MPEG-TS files join byte by byte)."""
    path = Path(path)
    parts = []
    for size in (SIZE, (64, 48)):
        part = path.with_name(f"{path.stem}-{size[0]}{path.suffix}")
        with av.open(str(part), "w", format="mpegts") as container:
            stream = container.add_stream("mpeg4", rate=8)
            stream.width, stream.height = size
            stream.pix_fmt = "yuv420p"
            for pixels in numbered_frames(frames, size):
                container.mux(stream.encode(av.VideoFrame.from_ndarray(pixels, format="rgb24")))
            container.mux(stream.encode())
        parts.append(part.read_bytes())
        part.unlink()
    path.write_bytes(b"".join(parts))
    return path


def write_with_audio(path: Path, frames: int = 8, audio_seconds: float = 3.0) -> Path:
    """A numbered clip at 8 fps with a silent audio track that runs ``audio_seconds``, longer
    than the video, as clips cut from recordings often have: the file's duration is the
    audio's."""
    path = Path(path)
    codec, pixel_format = CODECS[path.suffix.lower()]
    audio_codec = "aac" if path.suffix.lower() in (".mp4", ".mov") else "libopus"
    with av.open(str(path), "w") as container:
        video = container.add_stream(codec, rate=8)
        video.width, video.height = SIZE
        video.pix_fmt = pixel_format
        audio = container.add_stream(audio_codec, rate=48000)
        for pixels in numbered_frames(frames):
            container.mux(video.encode(av.VideoFrame.from_ndarray(pixels, format="rgb24")))
        container.mux(video.encode())
        chunk = 1024 if audio_codec == "aac" else 960  # the encoders' frame sizes
        for start in range(0, int(48000 * audio_seconds), chunk):
            sound = av.AudioFrame.from_ndarray(np.zeros((1, chunk), np.float32), "flt", "mono")
            sound.sample_rate, sound.pts = 48000, start
            container.mux(audio.encode(sound))
        container.mux(audio.encode())
    return path
