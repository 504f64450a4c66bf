"""Broken videos and folders of frames: each is named in one line, with what is wrong, when it is
probed (before training), or when it is decoded if it broke after its probe."""

from __future__ import annotations

import os

import pytest
from PIL import Image

from library.data.video_decode import decode_frames
from library.data.videos import probe_video
from library.errors import DataError
from tests.kits import videos as kit


def _empty_folder(path):
    path.mkdir()
    return path


def _two_sizes(path):
    folder = kit.write_frame_folder(path, kit.numbered_frames(3))
    Image.new("RGB", (20, 20)).save(folder / "frame4.png")
    return folder


def _pipe(path):
    os.mkfifo(path)
    return path


def _cut_index(path):
    """An mp4 cut in half: its index (written last) is lost."""
    kit.write_video(path, kit.numbered_frames(20))
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    return path


# (file name, how it is made, words the line must hold)
BROKEN = [
    ("empty.mp4", kit.write_zero_frames, "holds no video"),
    ("empty.mkv", kit.write_zero_frames, "holds no video frames"),
    ("empty.webm", kit.write_zero_frames, "holds no video frames"),
    ("cut.mp4", kit.write_truncated, "is truncated"),
    ("cut.mov", kit.write_truncated, "is truncated"),
    ("cut.webm", kit.write_truncated, "is truncated"),
    ("no_index.mp4", _cut_index, "is damaged"),
    ("noise.mp4", kit.write_corrupt, "is damaged"),
    ("notes.mp4", kit.write_not_a_video, "is damaged or not a video"),
    ("joined.ts", kit.write_size_change, "changes size at frame 4 (48x32 to 64x48)"),
    ("pipe.mp4", _pipe, "is not a regular file"),
    ("gone.mp4", lambda path: path, "does not exist"),
    ("no_frames", _empty_folder, "holds no image files"),
    ("two_sizes", _two_sizes, "frame4.png is 20x20"),
]


@pytest.mark.parametrize(("name", "make", "words"), BROKEN, ids=[b[0] for b in BROKEN])
def test_a_broken_video_is_named_in_one_line(tmp_path, name, make, words):
    path = make(tmp_path / name)
    with pytest.raises(DataError) as caught:
        probe_video(path)
    message = str(caught.value)
    assert str(path) in message and "\n" not in message
    assert words in message
    assert caught.value.problems[0].file is not None


def test_a_file_that_is_not_a_video_is_named_when_decoded_too(tmp_path):
    path = kit.write_not_a_video(tmp_path / "notes.mp4")
    with pytest.raises(DataError, match="is damaged or not a video"):
        decode_frames(path, [0])


def test_a_video_that_lost_frames_since_its_scan_is_named_when_decoded(tmp_path):
    path = kit.write_video(tmp_path / "clip.mp4", kit.numbered_frames(5))
    with pytest.raises(DataError) as caught:
        decode_frames(path, [2, 7])
    message = str(caught.value)
    assert str(path) in message and "has 5 frames" in message and "scan it anew" in message
