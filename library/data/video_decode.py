"""Decoding the chosen frames of a probed video (library/data/videos.py) as uint8 RGB.

Decisions:
- Frames are numbered in presentation order from 0, as the probe numbers them; they are turned
  as displayed and their pixels made square, as the probe sizes them.
- Transparent pixels (gif, vp9 with alpha) are composited on white, as for images.
- Decoding frames that start past the first seeks to the keyframe at or before the first one
  asked (the packets' timestamps, read without decoding, give each frame's number) and decodes
  forward from there, instead of decoding the file from its start for every clip. Where the
  packets leave doubt (as for the probe: timestamps missing or repeated, leading frames that do
  not decode, packets flagged corrupt) or the seek does not land before the first frame asked,
  the file is decoded from its start, counting frames as they decode.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Sequence
from pathlib import Path

import av
import numpy as np
from PIL import Image

from library.data.images import load_display_image
from library.data.videos import (
    damaged,
    display_rotation,
    frame_files,
    read_packets,
    size_change,
    square_pixels,
    unreadable,
    video_stat_key,
    video_stream,
)
from library.errors import DataError


def decode_frames(path: Path, indices: Sequence[int] | None = None) -> np.ndarray:
    """The frames ``indices`` (presentation order from 0, as probe_video counts them; all when
    None) of the video file or folder of frames at ``path``, as uint8 RGB [F, H, W, 3] in the
    order asked, turned as displayed and transparency on white. DataError naming the file when
    it cannot be read or holds fewer frames than asked (it changed since it was probed)."""
    path = Path(path)
    if path.is_dir():
        files = frame_files(path)
        wanted = range(len(files)) if indices is None else indices
        _check_indices(path, wanted, len(files))
        return np.stack([np.asarray(load_display_image(files[i])) for i in wanted])
    try:
        frames = _decode_file(path, indices)
    except DataError:
        raise
    except (av.FFmpegError, OSError, ValueError) as error:
        raise damaged(path, error) from error
    return frames


def _decode_file(path: Path, indices: Sequence[int] | None) -> np.ndarray:
    if indices and min(indices) > 0:
        sought = _decode_from_keyframe(path, indices)
        if sought is not None:
            return sought
    wanted = None if indices is None else set(indices)
    last = None if indices is None else max(indices, default=-1)
    got: dict[int, np.ndarray] = {}
    count = 0
    with av.open(str(path)) as container:
        stream = video_stream(container, path)
        stream.thread_type = "AUTO"
        size = None
        for index, frame in enumerate(container.decode(stream)):
            size = size or (frame.width, frame.height)
            if (frame.width, frame.height) != size:  # in a part of the file the probe skips
                raise size_change(path, index, size, frame)
            square = square_pixels(size, stream)
            count = index + 1
            if wanted is None or index in wanted:
                got[index] = _rgb(frame, square)
            if last is not None and index >= last:
                break
    order = range(count) if indices is None else indices
    _check_indices(path, order, count)
    if not got:
        raise unreadable(path, "holds no video frames")
    return np.stack([got[i] for i in order])


def _frame_stamps(path: Path) -> tuple[list[int], tuple[int, int]] | None:
    """Each frame's presentation timestamp in presentation order (from the packets, decoding
    only the first frame) and the stored frame size; None when the packets leave doubt about
    which frame is which (module docstring). Kept for the file as it is now: the clips of one
    video read its packets once."""
    return _stamps_of(str(path), video_stat_key(path))


@functools.lru_cache(maxsize=64)
def _stamps_of(path: str, _: tuple[int, int]) -> tuple[list[int], tuple[int, int]] | None:
    with av.open(path) as container:
        stamps, _, first, corrupt = read_packets(container, video_stream(container, Path(path)))
    if first is None or corrupt or None in stamps or len(set(stamps)) != len(stamps):
        return None
    order = sorted(stamps)
    return (order, (first.width, first.height)) if first.pts == order[0] else None


def _decode_from_keyframe(path: Path, indices: Sequence[int]) -> np.ndarray | None:
    """The frames ``indices`` decoded from the keyframe at or before the first of them; None
    when that cannot be done surely (the caller decodes from the start)."""
    found = _frame_stamps(path)
    if found is None or max(indices) >= len(found[0]):
        return None  # a missing frame is named by the decode from the start
    order, size = found
    number = {stamp: index for index, stamp in enumerate(order)}
    wanted, last = set(indices), order[max(indices)]
    got: dict[int, np.ndarray] = {}
    with av.open(str(path)) as container:
        stream = video_stream(container, path)
        stream.thread_type = "AUTO"
        square = square_pixels(size, stream)
        try:
            container.seek(order[min(indices)], stream=stream, backward=True, any_frame=False)
        except av.FFmpegError:  # a format that cannot seek
            return None
        for frame in container.decode(stream):
            index = number.get(frame.pts)
            if index is None or (not got and index > min(indices)):
                return None  # a frame of unknown number, or the seek landed past the first
            if (frame.width, frame.height) != size:
                raise size_change(path, index, size, frame)
            if index in wanted:
                got[index] = _rgb(frame, square)
            if frame.pts >= last:
                break
    if len(got) != len(wanted):
        return None
    return np.stack([got[i] for i in indices])


def _check_indices(path: Path, indices: Iterable[int], count: int) -> None:
    missing = [i for i in indices if not 0 <= i < count]
    if missing:
        raise DataError(
            f"video {path} has {count} frames that decode, fewer than the {max(missing) + 1} "
            "its scan counted: it is damaged or changed since; replace it, or run again to "
            "scan it anew",
            file=str(path),
        )


def _rgb(frame, square: tuple[int, int]) -> np.ndarray:
    """One decoded frame as uint8 RGB, transparency on white, at its ``square``-pixel size
    (square_pixels; LANCZOS, as images are resized), turned as displayed."""
    if _has_alpha(frame.format):
        rgba = frame.to_ndarray(format="rgba").astype(np.float32)
        alpha = rgba[..., 3:] / 255.0
        rgb = np.rint(rgba[..., :3] * alpha + 255.0 * (1.0 - alpha)).astype(np.uint8)
    else:
        rgb = frame.to_ndarray(format="rgb24")
    if square != (frame.width, frame.height):
        rgb = np.asarray(Image.fromarray(rgb).resize(square, Image.Resampling.LANCZOS))
    turns = display_rotation(frame) // 90
    return np.ascontiguousarray(np.rot90(rgb, k=-turns)) if turns else rgb


def _has_alpha(pixel_format) -> bool:
    # grey + alpha and colour + alpha have 2 and 4 components; a palette may hold transparency
    return len(pixel_format.components) in (2, 4) or pixel_format.has_palette
