"""Decoding a clip that starts past a video's first frame seeks to the keyframe before it and
decodes forward, giving the very frames a decode from the file's start gives; files whose
packets leave doubt are decoded from the start as before."""

from __future__ import annotations

import av
import numpy as np
import pytest

import library.data.video_decode as videos
from library.data.video_decode import decode_frames
from tests.kits import videos as kit

FRAMES = 60  # numbered clips hold up to 64
KEYFRAME_EVERY = 8
CLIPS = ([0, 1, 2], [17, 18, 19, 20], [40, 44, 48], [52, 53, 54, 55], [59])
SEEKING = [(".mp4", None), (".mkv", None), (".mov", None), (".webm", None), (".webm", "libvpx")]


class _Counted:
    """A container whose decode() counts the frames it gives."""

    def __init__(self, container, counter: list[int]) -> None:
        self._container, self._counter = container, counter

    def __enter__(self):
        self._container.__enter__()
        return self

    def __exit__(self, *exc):
        return self._container.__exit__(*exc)

    def __getattr__(self, name):
        return getattr(self._container, name)

    def decode(self, *args, **kwargs):
        for frame in self._container.decode(*args, **kwargs):
            self._counter[0] += 1
            yield frame


@pytest.fixture
def decoded_frames(monkeypatch):
    """[frames decoded by container.decode since the test began]."""
    counter = [0]
    real = av.open
    monkeypatch.setattr(videos.av, "open", lambda *a, **k: _Counted(real(*a, **k), counter))
    return counter


@pytest.mark.parametrize(("extension", "codec"), SEEKING)
def test_a_later_clip_is_decoded_from_its_keyframe_to_the_same_frames(
    tmp_path, extension, codec, decoded_frames
):
    path = kit.write_video(tmp_path / f"v{extension}", kit.numbered_frames(FRAMES), fps=16,
                           codec=codec, keyframe_every=KEYFRAME_EVERY)  # fmt: skip
    whole = decode_frames(path)
    assert [kit.frame_index(f) for f in whole] == list(range(FRAMES))
    for clip in CLIPS:
        decoded_frames[0] = 0
        frames = decode_frames(path, clip)
        assert np.array_equal(frames, whole[clip]), clip
        # from the keyframe at or before the clip's first frame: at most a group before it
        assert decoded_frames[0] <= clip[-1] - clip[0] + KEYFRAME_EVERY + 1, (clip, decoded_frames)


def test_a_gif_clip_is_its_frames(tmp_path):
    path = kit.write_video(tmp_path / "v.gif", kit.numbered_frames(24), fps=10)
    whole = decode_frames(path)
    for clip in ([5, 6, 7], [20, 23]):
        assert np.array_equal(decode_frames(path, clip), whole[clip])


def test_a_file_without_frame_stamps_is_decoded_from_its_start(tmp_path, monkeypatch):
    """Where the packets leave doubt, frames are counted as they decode from the start."""
    path = kit.write_video(tmp_path / "v.mp4", kit.numbered_frames(20), keyframe_every=4)
    monkeypatch.setattr(videos, "_frame_stamps", lambda _: None)
    frames = decode_frames(path, [12, 13, 14])
    assert [kit.frame_index(f) for f in frames] == [12, 13, 14]
