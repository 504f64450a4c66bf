"""The video probe reads packets, not frames: its header is the one a decode of every frame gives,
without that decode, and damage it cannot see is named by the decode that uses the frames."""

from __future__ import annotations

import av
import pytest

from library.data import videos
from library.data.video_decode import decode_frames
from library.data.videos import clips_of, probe_video
from library.errors import DataError
from tests.kits import videos as kit

SQUARE = (64, 64)  # a size every encoder here takes


def _decoded(path):
    """(frame count, (width, height), times from the first frame) by decoding every frame."""
    with av.open(str(path)) as container:
        frames = list(container.decode(video=0))
    start = frames[0].time
    return len(frames), (frames[0].width, frames[0].height), [f.time - start for f in frames]


def _b_frames(path, codec, container_format=None):
    """40 numbered frames through ``codec`` with B-frames and a keyframe every 12, for the
    containers the kit has no writer for (AVI, MPEG program and transport streams)."""
    with av.open(str(path), "w", format=container_format) as container:
        stream = container.add_stream(codec, rate=25)
        stream.width, stream.height, stream.pix_fmt = *kit.SIZE, "yuv420p"
        stream.codec_context.max_b_frames, stream.codec_context.gop_size = 2, 12
        for pixels in kit.numbered_frames(40):
            container.mux(stream.encode(av.VideoFrame.from_ndarray(pixels, format="rgb24")))
        container.mux(stream.encode())
    return path


# (name, how it is written): B-frames over several keyframe groups, one group longer than the
# probe decodes whole, open groups (HEVC), and other containers' timestamps
CASES = [
    ("groups.mp4", lambda p: kit.write_video(p, kit.numbered_frames(40), keyframe_every=8)),
    ("one_group.mp4", lambda p: kit.write_video(p, kit.numbered_frames(64))),
    ("groups.mov", lambda p: kit.write_video(p, kit.numbered_frames(40), keyframe_every=8)),
    ("groups.mkv", lambda p: kit.write_video(p, kit.numbered_frames(40), keyframe_every=8)),
    ("groups.webm", lambda p: kit.write_video(p, kit.numbered_frames(40), keyframe_every=8)),
    (
        "hevc.mkv",
        lambda p: kit.write_video(
            p, kit.numbered_frames(40, SQUARE), codec="libx265", keyframe_every=8
        ),
    ),
    ("b_frames.avi", lambda p: _b_frames(p, "mpeg4")),
    ("b_frames.mpg", lambda p: _b_frames(p, "mpeg2video", "mpeg")),
    ("b_frames.ts", lambda p: _b_frames(p, "libx264", "mpegts")),
    ("anim.gif", lambda p: kit.write_video(p, kit.numbered_frames(20), fps=10)),
    (
        "vfr.mp4",
        lambda p: kit.write_video(p, kit.numbered_frames(6), times=[0, 0.1, 0.15, 0.5, 0.6, 1]),
    ),
]


@pytest.mark.parametrize(("name", "write"), CASES, ids=[c[0] for c in CASES])
def test_the_probe_gives_a_full_decodes_count_and_times_without_it(
    tmp_path, monkeypatch, name, write
):
    if name.startswith("hevc") and "libx265" not in av.codecs_available:
        pytest.skip("this PyAV has no HEVC encoder")
    path = write(tmp_path / name)

    def decode_everything(path):
        raise AssertionError(f"{path}: the probe decoded every frame")

    monkeypatch.setattr(videos, "_probe_decoding", decode_everything)
    header = probe_video(path)
    count, size, times = _decoded(path)
    assert (header.frames, header.size) == (count, size)
    assert header.times == pytest.approx(times, abs=1e-6)


@pytest.mark.parametrize("extension", [".mp4", ".mov"])
def test_damage_in_the_middle_is_named_by_the_decode_that_uses_the_frames(tmp_path, extension):
    path = kit.write_corrupt_middle(tmp_path / f"noise{extension}", frames=48, group=8)
    with pytest.raises(av.FFmpegError):  # the damage is real: a plain decode fails on it
        _decoded(path)
    header = probe_video(path)  # packets and timestamps are intact: the probe cannot see it
    assert header.frames == 48
    early = decode_frames(path, range(8))  # frames before the damage still decode
    assert [kit.frame_index(frame) for frame in early] == list(range(8))
    for decode in (
        lambda: decode_frames(path),
        lambda: decode_frames(path, clips_of(header, None, target_frames=[41])[0].source_frames),
        lambda: decode_frames(path, range(12, 40)),  # from the keyframe before frame 12
    ):
        with pytest.raises(DataError) as caught:
            decode()
        message = str(caught.value)
        assert str(path) in message and "\n" not in message and "is damaged" in message


def test_a_size_change_is_named_by_the_decode_too(tmp_path):
    path = kit.write_size_change(tmp_path / "joined.ts", frames=4)
    with pytest.raises(DataError) as caught:
        decode_frames(path)
    message = str(caught.value)
    assert str(path) in message and "changes size at frame 4 (48x32 to 64x48)" in message
