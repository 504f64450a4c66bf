"""Reading training videos: probed once up front (here), then the chosen frames decoded as RGB
(library/data/video_decode.py).

A video is a file PyAV opens (mp4, webm, mov, mkv, gif, ...; PyAV's wheels carry FFmpeg) or a
folder of frames (its image files, in natural order: frame2 before frame10).

Decisions:
- The probe reads the video stream's packets without decoding them: the frame count is the
  number of packets, each frame's time its packet's presentation timestamp (sorted: B-frames
  are stored out of order). It decodes only the first frame (size, rotation, pixel aspect,
  and that the stream decodes at all) and the group of packets from the last keyframe (at most
  _TAIL_PACKETS of them, else the keyframe alone), which must give a frame at each packet's
  time and of the first frame's size. When the packets leave doubt (a packet without a
  timestamp or flagged corrupt, two at one time, leading frames that do not decode, a last
  group that disagrees), every frame is decoded instead and counted as it decodes. Headers'
  frame counts are never trusted: many files have none (webm, gif) or a wrong one.
- Damage in the middle of a stream is not seen by the probe: decoding names the file in
  one line when it meets it (the latent cache is filled before training), and a frame the
  decoder drops there makes the file hold fewer frames than its probe counted, named too.
- A file whose frames end well before the duration its header gives (over 5% and two frames
  short) is truncated: a partial download or copy. It is refused, not trained shorter.
- Rotation metadata (a phone's display matrix) is applied: the frames are trained the way
  players show them, as images are with their EXIF orientation. Non-square pixels (anamorphic
  video) are made square by stretching the side that grows. The size is the displayed one.
- Each frame's time is its presentation timestamp. A file whose frame durations differ by more
  than 10% from their median has a variable frame rate: its frames are placed by these times
  when resampled to the model's rate (library.data.frame_extraction.resample_times).
- Frames are numbered in presentation order from 0, the same numbering probe and decode use.
"""

from __future__ import annotations

import math
import os
import re
import stat
import statistics
from dataclasses import dataclass
from pathlib import Path

import av

from library.data.folders import IMAGE_EXTENSIONS
from library.data.frame_extraction import Clip, cut_clips
from library.data.images import read_image_header
from library.errors import DataError

# musubi-tuner's video extensions plus gif (an animation trained as a clip in a video dataset)
VIDEO_EXTENSIONS = frozenset(
    {".mp4", ".webm", ".avi", ".mkv", ".mov", ".flv", ".wmv", ".m4v", ".mpg", ".mpeg", ".gif"}
)
_TRUNCATED_SHARE = 0.05  # of the header's duration missing at the end
_VFR_SPREAD = 0.10  # of the median frame duration
_TAIL_PACKETS = 16  # the last keyframe's group is decoded whole up to this many packets
_NATURAL = re.compile(r"(\d+)")
_DURATION_TAG = re.compile(r"^(\d+):(\d+):(\d+(?:\.\d*)?)$")  # Matroska's "00:00:05.000000000"


@dataclass(frozen=True)
class VideoHeader:
    """What a scan needs to know about a video: its frames and how they are shown.

    ``size`` is (width, height) as displayed (rotation applied); ``rotation`` the degrees
    clockwise the stored frames are turned for display (0, 90, 180, 270); ``times`` each
    frame's presentation time in seconds from the first frame (None for a folder of frames,
    which has no clock); ``fps`` the average frame rate (frames over duration; None for a
    folder); ``variable_frame_rate`` whether the frames are unevenly spaced in time.
    """

    frames: int
    size: tuple[int, int]
    fps: float | None
    duration: float | None
    rotation: int = 0
    variable_frame_rate: bool = False
    times: tuple[float, ...] | None = None


def is_video_path(path: Path) -> bool:
    """Whether ``path`` names a video file by its extension (any case)."""
    return Path(path).suffix.lower() in VIDEO_EXTENSIONS


def frame_files(folder: Path) -> list[Path]:
    """The image files of a folder of frames in natural order (digits compared as numbers),
    hidden files left out."""
    files = [
        entry
        for entry in Path(folder).iterdir()
        if not entry.name.startswith(".") and entry.suffix.lower() in IMAGE_EXTENSIONS
    ]
    return sorted(files, key=_natural_key)


def _natural_key(path: Path) -> tuple:
    return tuple(int(p) if p.isdigit() else p.lower() for p in _NATURAL.split(path.name))


def unreadable(path: Path, reason: str, fix: str = "replace or remove the file") -> DataError:
    """The one line naming the video file, what is wrong with it (``reason``) and the fix."""
    return DataError(f"video {path} {reason}; {fix}", file=str(path))


def probe_video(path: Path) -> VideoHeader:
    """The frame count, displayed size, rotation, frame rate, duration and frame times of the
    video file or folder of frames at ``path``, from its packets and a few decoded frames
    (module docstring). DataError naming the file, one line, when it is missing, not a video,
    truncated, has no frames, or is damaged where the probe decodes."""
    path = Path(path)
    if path.is_dir():
        return _probe_folder(path)
    _check_regular_file(path)
    try:
        return _probe_packets(path) or _probe_decoding(path)
    except DataError:
        raise
    except (av.FFmpegError, OSError, ValueError) as error:
        raise damaged(path, error) from error


def _probe_packets(path: Path) -> VideoHeader | None:
    """The header from the video packets' timestamps (no decoding), the first frame and the
    last keyframe's group (_Tail); None when the packets and those frames disagree or leave
    doubt, for _probe_decoding to count the frames that really decode."""
    with av.open(str(path)) as container:
        stream = video_stream(container, path)
        decoder = stream.codec_context
        stamps, tail, first, corrupt = read_packets(container, stream)
        if first is None or None in stamps or len(set(stamps)) != len(stamps):
            return None
        start, size = min(stamps), (first.width, first.height)
        if first.pts != start:  # leading frames that do not decode
            return None
        header = _header(  # names a file whose frames end before its header's duration
            path,
            [float((t - start) * stream.time_base) for t in sorted(stamps)],
            square_pixels(size, stream),
            display_rotation(first),
            _declared_duration(container, stream),
        )
        if corrupt:
            return None
        if not tail.whole and tail.packets and tail.packets[0].pts == start:
            return header  # one long group: its keyframe is the first frame, decoded above
        return header if _tail_agrees(path, decoder, tail.packets, sorted(stamps), size) else None


class _Tail:
    """The packets from the last keyframe demuxed so far: all of them while there are at most
    _TAIL_PACKETS, else the keyframe alone (its group is too long to decode whole)."""

    def __init__(self) -> None:
        self.packets: list = []
        self.whole = True

    def add(self, packet) -> None:
        if packet.is_keyframe:
            self.packets, self.whole = [packet], True
        elif self.packets and self.whole:
            self.packets.append(packet)
            if len(self.packets) > _TAIL_PACKETS:
                self.packets, self.whole = self.packets[:1], False


def read_packets(container, stream) -> tuple[list, _Tail, object, bool]:
    """Every packet of ``stream``: their timestamps (None where a packet has none), the last
    keyframe's group (_Tail), the first decoded frame (None if none decodes) and whether the
    demuxer marked any packet corrupt."""
    decoder = stream.codec_context
    stamps, tail, first, corrupt = [], _Tail(), None, False
    for packet in container.demux(stream):
        if packet.size == 0 or packet.is_discard:  # the closing empty packet; edit lists
            continue
        corrupt = corrupt or packet.is_corrupt
        stamps.append(packet.pts)
        tail.add(packet)
        if first is None:
            first = next(iter(decoder.decode(packet)), None)
    if first is None and stamps:
        first = next(iter(decoder.decode(None)), None)
    return stamps, tail, first, corrupt


def _tail_agrees(path: Path, decoder, tail: list, stamps: list[int], size) -> bool:
    """Decode ``tail`` (_Tail's packets) anew: each packet shown from its keyframe on must give
    a frame at its timestamp, all of the first frame's ``size`` (else a DataError names the frame
    where the size changes). Leading pictures shown before the keyframe (open groups) may not
    decode without the group before; they count as the full decode counts them. False when
    the frames and packets disagree."""
    if not tail:
        return False
    decoder.flush_buffers()
    try:
        frames = [f for packet in [*tail, None] for f in decoder.decode(packet)]
    except av.FFmpegError:  # damage near the end: the full decode names it
        return False
    shown = {f.pts for f in frames}
    owed = {p.pts for p in tail if p.pts >= tail[0].pts}
    if len(shown) != len(frames) or not owed <= shown <= {p.pts for p in tail}:
        return False
    for frame in frames:
        if (frame.width, frame.height) != size:
            raise size_change(path, stamps.index(frame.pts), size, frame)
    return True


def _probe_decoding(path: Path) -> VideoHeader:
    """The header from decoding every frame: the count is the frames that really decode."""
    with av.open(str(path)) as container:
        stream = video_stream(container, path)
        stream.thread_type = "AUTO"
        times, rotation, size = [], 0, None
        for frame in container.decode(stream):
            if size is None:
                size, rotation = (frame.width, frame.height), display_rotation(frame)
            elif (frame.width, frame.height) != size:
                raise size_change(path, len(times), size, frame)
            times.append(frame.time)
        declared = _declared_duration(container, stream)
        square = square_pixels(size, stream) if size else None
    if not times:
        raise unreadable(path, "holds no video frames")
    return _header(path, times, square, rotation, declared)


def _check_regular_file(path: Path) -> None:
    """Name a missing path, or one that is not a regular file (a pipe or device, which FFmpeg
    would wait on forever)."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        raise DataError(
            f"video {path} does not exist; fix the path or remove the entry", file=str(path)
        ) from None
    except OSError:
        return  # unreadable: FFmpeg's open names the reason
    if not stat.S_ISREG(mode):
        raise unreadable(path, "is not a regular file (a pipe, device or socket)")


def size_change(path: Path, index: int, size: tuple[int, int], frame) -> DataError:
    return unreadable(
        path,
        f"changes size at frame {index} ({size[0]}x{size[1]} to {frame.width}x{frame.height})",
        "re-encode it at one size or remove it",
    )


def square_pixels(size: tuple[int, int], stream) -> tuple[int, int]:
    """The (width, height) a frame of ``size`` is shown at, its pixels made square: a file
    with non-square pixels (anamorphic DVD and broadcast video) is stretched along the side
    that grows, as players do, so no stored pixel is lost."""
    aspect = stream.sample_aspect_ratio or stream.codec_context.sample_aspect_ratio
    if not aspect or aspect <= 0 or aspect == 1:
        return size
    width, height = size
    if aspect > 1:
        return round(width * aspect), height
    return width, round(height / aspect)


def video_stream(container, path: Path):
    """The file's first video stream; DataError naming the file when it has none."""
    if not container.streams.video:
        raise unreadable(path, "holds no video stream")
    return container.streams.video[0]


def _declared_duration(container, stream) -> float | None:
    """The video stream's duration as the file's header gives it: the stream's own, or its
    DURATION tag (Matroska, WebM), or the file's when the video is its only stream (a file's
    duration covers its audio too, which may run longer)."""
    if stream.duration is not None and stream.time_base is not None:
        return float(stream.duration * stream.time_base)
    tag = _DURATION_TAG.match(stream.metadata.get("DURATION", ""))
    if tag:
        hours, minutes, seconds = tag.groups()
        return int(hours) * 3600 + int(minutes) * 60 + float(seconds)
    if container.duration is not None and len(container.streams) == 1:
        return container.duration / av.time_base
    return None


def display_rotation(frame) -> int:
    """Degrees clockwise to turn the stored frame for display. FFmpeg's display matrix angle
    is counter-clockwise, as its command-line tool reads it when it autorotates."""
    angle = frame.rotation or 0
    if not math.isfinite(angle):  # a singular matrix: no rotation to read
        return 0
    return int(round(-angle / 90.0)) % 4 * 90


def _header(
    path: Path,
    raw_times: list[float | None],
    size: tuple[int, int],
    rotation: int,
    declared: float | None,
) -> VideoHeader:
    times = _clean_times(raw_times)
    durations = [b - a for a, b in zip(times, times[1:], strict=False)]
    typical = statistics.median(durations) if durations else None
    end = times[-1] + (typical or 0.0)
    if declared and typical and declared - end > max(2 * typical, _TRUNCATED_SHARE * declared):
        raise unreadable(
            path,
            f"is truncated: its frames end at {end:.2f} s of the {declared:.2f} s its header "
            "gives (an incomplete download or copy?)",
        )
    variable = bool(typical) and any(abs(d - typical) > _VFR_SPREAD * typical for d in durations)
    shown = size if rotation in (0, 180) else (size[1], size[0])
    duration = end if end > 0 else None
    fps = len(times) / duration if duration else None
    return VideoHeader(len(times), shown, fps, duration, rotation, variable, tuple(times))


def _clean_times(raw: list[float | None]) -> list[float]:
    """Presentation times from the first frame; a frame without a timestamp is placed one
    typical step after the one before."""
    known = [t for t in raw if t is not None]
    if not known:
        return [float(i) for i in range(len(raw))]  # no clock at all: one frame a second
    first = known[0]
    times: list[float] = []
    for t in raw:
        if t is None:
            step = times[-1] - times[-2] if len(times) > 1 else 0.0
            t = (times[-1] + step if times else 0.0) + first
        times.append(float(t) - first)
    return times


def _probe_folder(folder: Path) -> VideoHeader:
    files = frame_files(folder)
    if not files:
        raise DataError(
            f"video folder {folder} holds no image files; add its frames or remove it",
            file=str(folder),
        )
    size = read_image_header(files[0]).size
    for file in files[1:]:
        other = read_image_header(file).size
        if other != size:
            raise DataError(
                f"frame {file} is {other[0]}x{other[1]} but the folder's first frame "
                f"{files[0].name} is {size[0]}x{size[1]}; give every frame of a clip one size",
                file=str(file),
            )
    return VideoHeader(len(files), size, None, None)


def damaged(path: Path, error: BaseException) -> DataError:
    """The one line for a file FFmpeg cannot open or decode: its reason without the error
    number and the C function FFmpeg names."""
    if isinstance(error, av.error.EOFError):
        return unreadable(path, "holds no video frames (it ends before its first frame)")
    reason = getattr(error, "strerror", None) or str(error).strip().splitlines()[0]
    if isinstance(error, av.FFmpegError):
        return unreadable(path, f"is damaged or not a video ({reason})")
    return unreadable(path, f"cannot be read ({reason})")


def video_stat_key(path: Path) -> tuple[int, int]:
    """(size in bytes, modification time in ns) of a video file, or of the newest frame of a
    folder of frames with their total size: what a scan index compares to know a probe is
    still valid."""
    path = Path(path)
    if path.is_dir():
        stats = [os.stat(f) for f in frame_files(path)]
        return sum(s.st_size for s in stats), max((s.st_mtime_ns for s in stats), default=0)
    info = os.stat(path)
    return info.st_size, info.st_mtime_ns


def clips_of(header: VideoHeader, model_fps: float | None, **settings) -> list[Clip]:
    """The clips musubi-tuner's frame settings (``target_frames``, ``frame_extraction``,
    ``frame_stride``, ``frame_sample``, ``max_frames``, ``source_fps``: cut_clips' keywords)
    cut from the probed video ``header`` at the model's frame rate ``model_fps``. A
    variable-frame-rate file is resampled by its frame times."""
    times = header.times if header.variable_frame_rate else None
    return cut_clips(header.frames, model_fps=model_fps, times=times, **settings)
