"""Which frames of a video become training clips: musubi-tuner's frame extraction, as pure
functions over frame counts and indices (no file is read here).

Words and defaults are musubi-tuner's video dataset keys, so its dataset configs cut the same
clips here:

- ``target_frames``: the clip lengths to cut. The VAE compresses time by ``vae_frame_stride``
  (4 for Wan), so each length is rounded down to ``stride * N + 1`` (1, 5, 9, ..., 81) and
  duplicates are dropped (round_target_frames).
- ``frame_extraction``, for a video of ``n`` frames and each length ``t`` of target_frames:
  ``head``: one clip of the first ``t`` frames, if ``n >= t``;
  ``chunk``: consecutive, non-overlapping clips from frame 0, as many whole ones as fit;
  ``slide``: clips starting every ``frame_stride`` frames while one fits;
  ``uniform``: ``frame_sample`` clips whose starts are spread evenly over 0 .. n - t (the
  starts are truncated to whole frames, so a short video can repeat a start, as in
  musubi-tuner); with ``frame_sample = 1`` it is ``head``, as musubi-tuner turns it into;
  ``full``: one clip of the whole video, cut to ``max_frames`` and rounded down to
  ``stride * N + 1``; target_frames is not used.
  A video shorter than a length gets no clip of that length.
- ``source_fps``: the frame rate the videos are taken to have. With it, frames are dropped to
  reach the model's frame rate (16 for Wan) before clips are cut: frame ``i`` lands on output
  frame ``floor(i * model_fps / source_fps)`` (summed step by step as musubi-tuner does, so
  the same frames are kept) and only the first frame landing on each output frame is kept.
  A video slower than the model's rate keeps every frame (nothing is repeated). Without
  ``source_fps`` every frame is kept whatever the file's own rate.
  Where a file's frames are not evenly spaced (variable frame rate), the frames are placed by
  their timestamps instead (resample_times): frame ``i`` lands on ``floor(t_i * model_fps)``,
  so a clip keeps the real speed of the motion.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

from library.errors import ConfigError

FRAME_EXTRACTIONS = ("head", "chunk", "slide", "uniform", "full")
VAE_FRAME_STRIDE = 4  # Wan's (and HunyuanVideo's) VAE: stride * N + 1 frames per clip
DEFAULT_TARGET_FRAMES = (1,)  # musubi-tuner's defaults
DEFAULT_MAX_FRAMES = 129


class Window(NamedTuple):
    """One clip cut from a video: ``frames`` consecutive frames from ``start`` (indices into
    the video after any frame-rate resampling)."""

    start: int
    frames: int

    def indices(self) -> range:
        return range(self.start, self.start + self.frames)


def round_frame_count(count: int, stride: int = VAE_FRAME_STRIDE) -> int:
    """``count`` rounded down to ``stride * N + 1`` (a count below 1 stays as it is)."""
    if count < 1:
        return count
    return (count - 1) // stride * stride + 1


def round_target_frames(
    target_frames: Sequence[int], stride: int = VAE_FRAME_STRIDE
) -> tuple[int, ...]:
    """musubi-tuner's ``target_frames`` as clip lengths: each rounded down to
    ``stride * N + 1``, duplicates dropped, sorted. ConfigError (key ``target_frames``) for an
    empty list or a length below 1."""
    if not target_frames:
        raise ConfigError(
            "target_frames is empty; give the clip lengths to train, e.g. [1, 25, 45]",
            key="target_frames",
        )
    bad = [t for t in target_frames if int(t) != t or t < 1]
    if bad:
        raise ConfigError(
            f"target_frames holds {bad[0]!r}; every clip length must be a whole number of "
            "frames, 1 or more",
            key="target_frames",
        )
    return tuple(sorted({round_frame_count(int(t), stride) for t in target_frames}))


def check_extraction(
    frame_extraction: str, frame_stride: int = 1, frame_sample: int = 1, max_frames: int = 129
) -> None:
    """ConfigError naming the key for a frame_extraction word or a count musubi-tuner would
    not accept."""
    if frame_extraction not in FRAME_EXTRACTIONS:
        raise ConfigError(
            f"frame_extraction = {frame_extraction!r} is not one of "
            f"{', '.join(FRAME_EXTRACTIONS)}; pick one of them",
            key="frame_extraction",
        )
    for key, value in (
        ("frame_stride", frame_stride),
        ("frame_sample", frame_sample),
        ("max_frames", max_frames),
    ):
        if int(value) != value or value < 1:
            raise ConfigError(f"{key} = {value!r} must be a whole number, 1 or more", key=key)


def extract_windows(
    frame_count: int,
    target_frames: Sequence[int] = DEFAULT_TARGET_FRAMES,
    frame_extraction: str = "head",
    frame_stride: int = 1,
    frame_sample: int = 1,
    max_frames: int = DEFAULT_MAX_FRAMES,
    stride: int = VAE_FRAME_STRIDE,
) -> list[Window]:
    """The clips musubi-tuner cuts from a video of ``frame_count`` frames (after resampling),
    in its order: per length of target_frames (rounded, round_target_frames), the windows of
    ``frame_extraction`` (module docstring). An empty list when the video is shorter than every
    length. ConfigError for settings musubi-tuner would not accept (check_extraction)."""
    check_extraction(frame_extraction, frame_stride, frame_sample, max_frames)
    if frame_count < 1:
        return []
    if frame_extraction == "full":
        return [Window(0, round_frame_count(min(frame_count, max_frames), stride))]
    if frame_extraction == "uniform" and frame_sample == 1:
        frame_extraction = "head"
    windows: list[Window] = []
    for length in round_target_frames(target_frames, stride):
        if frame_count < length:
            continue
        windows.extend(
            Window(start, length)
            for start in _starts(frame_extraction, frame_count, length, frame_stride, frame_sample)
        )
    return windows


def _starts(extraction: str, count: int, length: int, stride: int, samples: int) -> list[int]:
    if extraction == "head":
        return [0]
    if extraction == "chunk":
        return list(range(0, count - length + 1, length))
    if extraction == "slide":
        return list(range(0, count - length + 1, stride))
    # uniform: musubi-tuner's starts are numpy's linspace truncated to int; the same call keeps
    # its float rounding
    return [int(start) for start in np.linspace(0, count - length, samples, dtype=int)]


def frames_needed(
    target_frames: Sequence[int], frame_extraction: str, stride: int = VAE_FRAME_STRIDE
) -> int | None:
    """How many leading frames (after resampling) the clips can use: the longest target length
    for ``head``, else None (the whole video)."""
    if frame_extraction != "head":
        return None
    return max(round_target_frames(target_frames, stride))


def resample_indices(frame_count: int, source_fps: float | None, target_fps: float) -> list[int]:
    """The frames (indices into the file's ``frame_count`` frames) kept to play a video of
    ``source_fps`` at ``target_fps``: musubi-tuner's frame dropping (module docstring). All
    frames when ``source_fps`` is None."""
    if source_fps is None:
        return list(range(frame_count))
    if source_fps <= 0 or target_fps <= 0:
        raise ConfigError(f"source_fps = {source_fps!r} must be above 0", key="source_fps")
    step = target_fps / source_fps
    kept: list[int] = []
    position, previous = 0.0, -1
    for index in range(frame_count):
        # summed step by step, not index * step: a different rounding keeps a different frame
        landed = int(position)
        position += step
        if landed != previous:
            kept.append(index)
            previous = landed
    return kept


def resample_times(times: Sequence[float], target_fps: float) -> list[int]:
    """The frames (indices into ``times``, each frame's presentation time in seconds from the
    first) kept to play the video at ``target_fps``: the first frame landing on each output
    frame ``floor(t * target_fps)``. For a variable-frame-rate file, where index arithmetic
    would drift from the real motion."""
    if target_fps <= 0:
        raise ConfigError(f"the model's frame rate {target_fps!r} must be above 0")
    kept: list[int] = []
    previous = -1
    start = times[0] if times else 0.0
    for index, time in enumerate(times):
        # a tiny epsilon: 0.1 s at 10 fps must land on frame 1, not 0.999...
        landed = int((time - start) * target_fps + 1e-6)
        if landed != previous and landed > previous:
            kept.append(index)
            previous = landed
    return kept


class Clip(NamedTuple):
    """One clip to train: its window over the resampled frames, and the file's frame indices
    (presentation order from 0) that fill it."""

    window: Window
    source_frames: tuple[int, ...]


def cut_clips(
    frame_count: int,
    *,
    source_fps: float | None = None,
    model_fps: float | None = None,
    times: Sequence[float] | None = None,
    **extraction,
) -> list[Clip]:
    """The clips musubi-tuner's settings cut from a video of ``frame_count`` frames: its
    frames resampled from ``source_fps`` to ``model_fps`` (kept as they are without
    source_fps), then the windows of extract_windows over them (``extraction``: its keywords,
    ``target_frames``, ``frame_extraction``, ``frame_stride``, ``frame_sample``,
    ``max_frames``, ``stride``). ``times``: each frame's presentation time, given for a
    variable-frame-rate file, which is then resampled by its timestamps (resample_times)
    rather than by its index."""
    if source_fps is None or model_fps is None:
        kept = list(range(frame_count))
    elif times is not None:
        kept = resample_times(times, model_fps)
    else:
        kept = resample_indices(frame_count, source_fps, model_fps)
    windows = extract_windows(len(kept), **extraction)
    return [Clip(w, tuple(kept[i] for i in w.indices())) for w in windows]
