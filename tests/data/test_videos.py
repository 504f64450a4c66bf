"""Video files and folders of frames: probed (count, size, rate, rotation, times) and decoded
frame by frame, checked against what tests/kits/videos.py wrote into them (broken files:
test_video_damage.py)."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest
from PIL import Image

from library.data.frame_extraction import resample_times
from library.data.video_decode import decode_frames
from library.data.videos import (
    clips_of,
    frame_files,
    is_video_path,
    probe_video,
    video_stat_key,
)
from tests.kits import videos as kit

# (container, encoder): H.264 in mp4 and mkv, MPEG-4 part 2 in mov, VP9 and VP8 in webm, GIF
CONTAINERS = [
    (".mp4", None),
    (".mov", None),
    (".mkv", None),
    (".webm", None),
    (".webm", "libvpx"),
    (".gif", None),
]


@pytest.mark.parametrize(("extension", "codec"), CONTAINERS)
def test_every_container_probes_and_decodes_its_frames(tmp_path, extension, codec):
    frames = kit.numbered_frames(10)
    path = kit.write_video(tmp_path / f"clip{extension}", frames, fps=10, codec=codec)
    header = probe_video(path)  # 10 fps: GIF counts frame delays in hundredths of a second
    assert (header.frames, header.size, header.rotation) == (10, kit.SIZE, 0)
    assert header.fps == pytest.approx(10.0)
    assert header.duration == pytest.approx(1.0)
    assert not header.variable_frame_rate
    assert header.times == pytest.approx([i / 10 for i in range(10)], abs=1e-3)
    frames = decode_frames(path)
    assert frames.shape == (10, kit.SIZE[1], kit.SIZE[0], 3) and frames.dtype == np.uint8
    assert [kit.frame_index(frame) for frame in frames] == list(range(10))
    assert is_video_path(path)


def test_chosen_frames_come_in_the_order_asked(tmp_path):
    path = kit.write_video(tmp_path / "clip.mp4", kit.numbered_frames(12))
    frames = decode_frames(path, [7, 2, 3, 11])
    assert [kit.frame_index(frame) for frame in frames] == [7, 2, 3, 11]


def test_a_folder_of_frames_is_read_in_natural_order(tmp_path):
    folder = kit.write_frame_folder(tmp_path / "clip", kit.numbered_frames(12))
    (tmp_path / "clip" / ".hidden.png").write_bytes(b"")
    (tmp_path / "clip" / "notes.txt").write_text("not a frame")
    # plain string order would put frame10..frame12 after frame1
    assert [f.name for f in frame_files(folder)][:3] == ["frame1.png", "frame2.png", "frame3.png"]
    header = probe_video(folder)
    assert (header.frames, header.size, header.fps, header.times) == (12, kit.SIZE, None, None)
    frames = decode_frames(folder, [0, 9, 11])
    expected = kit.numbered_frames(12)[[0, 9, 11]]
    assert np.array_equal(frames, expected)  # PNG is lossless: the very pixels written


# FFmpeg's display matrix angle is counter-clockwise: a stored picture shown turned 90 degrees
# counter-clockwise has its top-left corner at the bottom left. -90 is what phones write for a
# portrait video held upright (turn 90 degrees clockwise).
@pytest.mark.parametrize(
    ("angle", "clockwise", "corner"),
    [(90, 270, "bottom-left"), (-90, 90, "top-right"), (180, 180, "bottom-right")],
)
def test_rotation_metadata_turns_frames_as_players_show_them(tmp_path, angle, clockwise, corner):
    path = kit.write_video(tmp_path / "phone.mp4", kit.numbered_frames(5), rotation=angle)
    header = probe_video(path)
    width, height = kit.SIZE
    assert header.rotation == clockwise
    assert header.size == ((width, height) if clockwise == 180 else (height, width))
    frames = decode_frames(path)
    assert frames.shape[1:3] == (header.size[1], header.size[0])
    assert {kit.marker_corner(frame) for frame in frames} == {corner}
    assert [kit.frame_index(frame) for frame in frames] == list(range(5))


def test_variable_frame_rate_keeps_each_frames_time(tmp_path):
    times = [0.0, 0.1, 0.15, 0.2, 0.5, 0.55, 0.6, 0.9, 1.0]
    path = kit.write_video(tmp_path / "vfr.mp4", kit.numbered_frames(9), times=times)
    header = probe_video(path)
    assert header.variable_frame_rate
    assert header.times == pytest.approx(times, abs=1e-3)
    kept = resample_times(header.times, 10.0)
    assert kept == [0, 1, 3, 4, 6, 7, 8]
    assert [kit.frame_index(f) for f in decode_frames(path, kept)] == kept


def test_transparent_gif_pixels_are_white(tmp_path):
    path = tmp_path / "alpha.gif"
    pictures = []
    for index in range(3):
        picture = Image.new("RGBA", kit.SIZE, (*kit.frame_colour(index), 255))
        picture.paste((0, 0, 0, 0), (0, 0, 16, 16))  # a transparent corner, black underneath
        pictures.append(picture)
    pictures[0].save(path, save_all=True, append_images=pictures[1:], duration=125, disposal=2)
    frames = decode_frames(path)
    assert frames.shape[0] == 3
    assert (frames[:, :16, :16] == 255).all()
    assert [kit.frame_index(frame) for frame in frames] == [0, 1, 2]


def test_clips_are_cut_from_the_resampled_frames(tmp_path):
    path = kit.write_video(tmp_path / "clip.mp4", kit.numbered_frames(20), fps=32)
    header = probe_video(path)
    # 32 -> 16 fps keeps every other frame (output frames 0, 0, 1, 1, 2, ...)
    clips = clips_of(header, 16.0, target_frames=[5], frame_extraction="chunk", source_fps=32.0)
    assert [c.source_frames for c in clips] == [(0, 2, 4, 6, 8), (10, 12, 14, 16, 18)]
    frames = decode_frames(path, clips[1].source_frames)
    assert [kit.frame_index(frame) for frame in frames] == [10, 12, 14, 16, 18]
    # without source_fps every frame is kept, whatever the file's rate
    plain = clips_of(header, 16.0, target_frames=[5], frame_extraction="chunk")
    assert [c.source_frames[0] for c in plain] == [0, 5, 10, 15]


def test_a_variable_rate_clip_is_cut_by_its_frame_times(tmp_path):
    times = [0.0, 0.05, 0.1, 0.15, 0.2, 0.6, 0.65, 0.7, 0.75, 0.8]
    path = kit.write_video(tmp_path / "vfr.mp4", kit.numbered_frames(10), times=times)
    header = probe_video(path)
    # at 10 fps: output frames 0, 0, 1, 1, 2, 6, 6, 7, 7, 8 -> the first of each; by index
    # (source_fps = 20) it would be 0, 2, 4, 6, 8
    clips = clips_of(header, 10.0, target_frames=[5], source_fps=20.0)
    assert [c.source_frames for c in clips] == [(0, 2, 4, 5, 7)]


@pytest.mark.parametrize("extension", [".mkv", ".webm", ".mp4"])
def test_audio_longer_than_the_video_is_not_taken_for_truncation(tmp_path, extension):
    path = kit.write_with_audio(tmp_path / f"talk{extension}")
    header = probe_video(path)
    assert (header.frames, header.duration) == (8, pytest.approx(1.0))
    assert [kit.frame_index(frame) for frame in decode_frames(path)] == list(range(8))


def test_the_stat_key_of_a_frame_folder_changes_with_any_frame(tmp_path):
    folder = kit.write_frame_folder(tmp_path / "clip", kit.numbered_frames(3))
    before = video_stat_key(folder)
    Image.fromarray(kit.numbered_frames(4)[3]).save(folder / "frame4.png")
    assert video_stat_key(folder) != before
    path = kit.write_video(tmp_path / "clip.mp4", kit.numbered_frames(3))
    assert video_stat_key(path) == (path.stat().st_size, path.stat().st_mtime_ns)


@pytest.mark.parametrize(
    ("extension", "aspect", "shown"),
    [(".mp4", Fraction(2, 1), (96, 32)), (".mkv", Fraction(1, 2), (48, 64))],
)
def test_non_square_pixels_are_shown_square(tmp_path, extension, aspect, shown):
    path = kit.write_video(
        tmp_path / f"dvd{extension}", kit.numbered_frames(3), pixel_aspect=aspect
    )
    assert probe_video(path).size == shown
    frames = decode_frames(path)
    assert frames.shape == (3, shown[1], shown[0], 3)
    assert [kit.frame_index(frame) for frame in frames] == [0, 1, 2]
    # the stored 8 x 8 marker is stretched with the picture: its white spans the stretched side
    width_scale, height_scale = shown[0] // kit.SIZE[0], shown[1] // kit.SIZE[1]
    marker = frames[0, : 8 * height_scale - 2, : 8 * width_scale - 2]
    assert marker.min() > 200
