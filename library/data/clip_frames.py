"""Decoding a video once for the many clips cut from it, while the latent cache is filled.

With frame_extraction slide or chunk one video gives many clips, and decoding each clip alone
decodes its frames and those from the keyframe before them (decode_frames), overlapping clips
many times over. ClipFrames knows every clip the fill will load and decodes the frames of a
video's clips in one pass, then cuts each clip out of them.

Decisions:
- A video's clips of one length are taken by first frame and gathered into groups whose
  frames together number at most GROUP_FRAMES (a clip longer than that is a group alone): the
  cache loads one length (one shape) at a time, and the cap bounds the memory a group holds.
  A clip's frames are the same pixels however they are decoded (one decoder, in order).
- A group stays decoded until every request for its clips has been loaded, or until more than
  KEEP_GROUPS groups are held (the least recently used leaves): memory stays bounded whatever
  order the loads come in. A group that left and is asked again is decoded again, never
  served stale or wrong frames.
- The cache's load threads ask at the same time: one decodes a group while the others that
  need it wait for it; different groups decode in parallel (FFmpeg releases the GIL).
- A file that cannot be decoded raises decode_frames' one-line DataError for each clip asked.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np

from library.data.video_decode import decode_frames

GROUP_FRAMES = 128  # frames one group holds: about 0.35 GB of 720p RGB
KEEP_GROUPS = 2  # groups held at once: the cache loads video by video, so two overlap at most


class _Group:
    """Clips of one video decoded together: the union of their frames, in order."""

    def __init__(self, path: Path, clips: list[tuple[int, ...]]) -> None:
        self.path = path
        self.frames = sorted({i for clip in clips for i in clip})
        self.row = {index: row for row, index in enumerate(self.frames)}
        self.lock = threading.Lock()
        self.pending = 0  # requests for its clips not yet loaded


def _grouped(clips: list[tuple[int, ...]]) -> list[list[tuple[int, ...]]]:
    """Clips (sorted by first frame) in runs whose frames together are at most GROUP_FRAMES."""
    groups: list[list[tuple[int, ...]]] = []
    frames: set[int] = set()
    for clip in clips:
        if groups and len(frames | set(clip)) <= GROUP_FRAMES:
            groups[-1].append(clip)
            frames.update(clip)
        else:
            groups.append([clip])
            frames = set(clip)
    return groups


class ClipFrames:
    """The frames of clips of videos, each video decoded once for all its clips (see the
    module docstring). ``clips``: (video path, frame indices) of every clip to be loaded, one
    per load (a clip loaded twice, e.g. flipped and not, is listed twice)."""

    def __init__(self, clips: Iterable[tuple[Path, Sequence[int]]]) -> None:
        wanted: dict[tuple[Path, int], list[tuple[int, ...]]] = {}
        for path, frames in clips:
            wanted.setdefault((Path(path), len(frames)), []).append(tuple(frames))
        self._group_of: dict[tuple[Path, tuple[int, ...]], _Group] = {}
        for (path, _), listed in wanted.items():
            for members in _grouped(sorted(set(listed))):
                group = _Group(path, members)
                for clip in members:
                    self._group_of[(path, clip)] = group
            for clip in listed:
                self._group_of[(path, clip)].pending += 1
        self._held: OrderedDict[int, np.ndarray] = OrderedDict()  # by id(group)
        self._lock = threading.Lock()
        self.decodes = 0  # passes over video files, for tests and benches

    def frames(self, path: Path, frames: Sequence[int]) -> np.ndarray:
        """The ``frames`` of the video at ``path`` as decode_frames gives them (uint8 RGB
        [F, H, W, 3]); a clip not listed at construction is decoded alone."""
        group = self._group_of.get((Path(path), tuple(frames)))
        if group is None:
            return decode_frames(path, list(frames))
        with group.lock:
            decoded = self._take(group)
            if decoded is None:
                decoded = decode_frames(group.path, group.frames)
                with self._lock:
                    self.decodes += 1
                    self._held[id(group)] = decoded
                    while len(self._held) > KEEP_GROUPS:
                        self._held.popitem(last=False)
            clip = decoded[[group.row[i] for i in frames]]
            with self._lock:
                group.pending -= 1
                if group.pending <= 0:
                    self._held.pop(id(group), None)
        return clip

    def _take(self, group: _Group) -> np.ndarray | None:
        with self._lock:
            decoded = self._held.get(id(group))
            if decoded is not None:
                self._held.move_to_end(id(group))
            return decoded
