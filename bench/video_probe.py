"""What probing a video costs during the dataset scan: difftune's probe (the video packets'
timestamps, the first frame and the last keyframe's group decoded) against a decode of every
frame (the probe's fallback, and what it did before), on generated H.264 clips.

    python bench/video_probe.py                               # 1280x720, 10 s at 24 fps
    python bench/video_probe.py --seconds 5 --keyint 250 24 --clips 3

Not a test and not timed in CI. Each clip is a textured picture sliding across the frame (real
motion and detail, so the encoder writes P- and B-frames of realistic size), encoded with
libx264 at 4 Mbit/s (--mbps; about what cameras and sites give 720p) and its default settings
except the keyframe interval: 250 is x264's and FFmpeg's
default (a 10 s clip at 24 fps is one keyframe group), 24 about one a second as phones write.
Clips are written once under --data and kept.

Per keyframe interval, the median over the clips of: full_decode_ms, probe_ms, and their
ratio; frames, and the probe's cost per frame. Both must give the same header (checked).
Human-readable lines go to stderr, one JSON object per interval to stdout.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import av
import numpy as np
from PIL import Image

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from library.data import videos  # noqa: E402

GRAIN = 8  # +- levels of fresh noise in every frame, as a camera's sensor gives


def write_clip(
    path: Path, size: tuple[int, int], frames: int, fps: int, keyint: int, bit_rate: int
) -> Path:
    """A smooth random picture sliding 4 pixels a frame under fresh grain, H.264 in mp4."""
    width, height = size
    rng = np.random.default_rng(0)
    wide = width + 4 * frames
    coarse = rng.integers(0, 256, (height // 24 + 1, wide // 24 + 1, 3), np.uint8)
    smooth = np.asarray(Image.fromarray(coarse).resize((wide, height), Image.Resampling.BICUBIC))
    texture = smooth.astype(np.int16)
    with av.open(str(path), "w") as container:
        stream = container.add_stream("libx264", rate=fps)
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        stream.codec_context.gop_size = keyint
        stream.bit_rate = bit_rate
        for index in range(frames):
            grain = rng.integers(-GRAIN, GRAIN + 1, (height, width, 3), np.int16)
            pixels = texture[:height, 4 * index : 4 * index + width] + grain
            pixels = np.ascontiguousarray(np.clip(pixels, 0, 255).astype(np.uint8))
            container.mux(stream.encode(av.VideoFrame.from_ndarray(pixels, format="rgb24")))
        container.mux(stream.encode())
    return path


def timed(probe, path: Path) -> tuple[float, object]:
    start = time.perf_counter()
    header = probe(path)
    return (time.perf_counter() - start) * 1000.0, header


def same_header(one, other) -> bool:
    """The same frames, size, rotation and rate kind; times, rate and duration to a
    microsecond (timestamps subtracted as fractions or as floats differ in the last bits)."""
    exact = ("frames", "size", "rotation", "variable_frame_rate")
    if any(getattr(one, name) != getattr(other, name) for name in exact):
        return False
    numbers = [*zip(one.times, other.times, strict=True)]
    numbers += [(one.fps, other.fps), (one.duration, other.duration)]
    return all(abs(a - b) < 1e-6 for a, b in numbers)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", default="1280x720", help="WIDTHxHEIGHT")
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--fps", type=int, default=24)
    parser.add_argument("--keyint", type=int, nargs="+", default=[250, 24])
    parser.add_argument("--clips", type=int, default=2)
    parser.add_argument("--mbps", type=float, default=4.0, help="the clips' bit rate")
    parser.add_argument("--data", type=Path, default=Path(tempfile.gettempdir()) / "video_probe")
    args = parser.parse_args()
    size = tuple(int(side) for side in args.size.split("x"))
    frames = round(args.seconds * args.fps)
    args.data.mkdir(parents=True, exist_ok=True)
    for keyint in args.keyint:
        full, probe = [], []
        for clip in range(args.clips):
            name = f"{size[0]}x{size[1]}_{frames}f_{args.fps}fps_{args.mbps:g}mbps_k{keyint}_{clip}.mp4"
            path = args.data / name
            if not path.exists():
                print(f"writing {path}", file=sys.stderr)
                write_clip(path, size, frames, args.fps, keyint, round(args.mbps * 1e6))
            full_ms, expected = timed(videos._probe_decoding, path)
            probe_ms, header = timed(videos.probe_video, path)
            if not same_header(header, expected):
                raise SystemExit(f"{path}: the probe's header differs from a full decode's")
            full.append(full_ms)
            probe.append(probe_ms)
        result = {
            "size": f"{size[0]}x{size[1]}",
            "frames": frames,
            "fps": args.fps,
            "keyint": keyint,
            "mbps": args.mbps,
            "full_decode_ms": round(statistics.median(full), 1),
            "probe_ms": round(statistics.median(probe), 1),
        }
        result["speedup"] = round(result["full_decode_ms"] / result["probe_ms"], 1)
        result["probe_ms_per_frame"] = round(result["probe_ms"] / frames, 3)
        print(
            f"{result['size']} {frames} frames, keyframe every {keyint}: full decode "
            f"{result['full_decode_ms']:.0f} ms, probe {result['probe_ms']:.0f} ms "
            f"({result['speedup']}x)",
            file=sys.stderr,
        )
        print(json.dumps(result))


if __name__ == "__main__":
    main()
