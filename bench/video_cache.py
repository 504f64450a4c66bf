"""What loading a video dataset's clips for the latent cache costs: each clip decoded alone
(the video read from its start for every clip) against each video decoded once for all its
clips (library.data.clip_frames, what the cache fill does), in one run on the same clips.

    python bench/video_cache.py                                  # 640x360, 10 s at 24 fps
    python bench/video_cache.py --size 1280 720 --seconds 20 --frames 33 --stride 8

Not a test and not timed in CI. The videos are a square moving across a textured background
(tests/kits/videos.py writes them as H.264 mp4), written once under a temporary folder. The
clips are musubi-tuner's slide extraction (--frames, --stride) cut from each video's probe, at
the videos' own size (no resize), so the figure is decoding. A clip decoded alone starts at
the keyframe before it (library.data.videos), so the gap between the two ways depends on how
far apart the keyframes are (--keyframe_every). Both ways must give the same
pixels (a sample of each clip's compared). Prints the seconds of each way and their ratio, for decoding alone and for the cache's
whole load (decoding, resizing and cropping, conversion to float).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from library.data.clip_frames import ClipFrames  # noqa: E402
from library.data.clips import ClipOptions, clip_frames  # noqa: E402
from library.data.latent_cache import LatentRequest  # noqa: E402
from library.data.samples import cache_loader, load_for_cache  # noqa: E402
from library.data.video_decode import decode_frames  # noqa: E402
from library.data.videos import probe_video  # noqa: E402
from tests.kits import videos as kit  # noqa: E402


def write_videos(
    folder: Path, count: int, size: tuple[int, int], frames: int, keyframe_every: int
) -> list[Path]:
    rng = np.random.default_rng(0)
    paths = []
    for i in range(count):
        clip = kit.moving_square(frames, size, side=size[1] // 4)
        texture = rng.integers(0, 48, (1, size[1], size[0], 3), dtype=np.uint8)
        paths.append(kit.write_video(folder / f"v{i}.mp4", clip // 2 + texture, fps=24,
                                     keyframe_every=keyframe_every))  # fmt: skip
    return paths


def requests_of(paths: list[Path], options: ClipOptions) -> list[LatentRequest]:
    requests = []
    for path in paths:
        header = probe_video(path)
        for frames in clip_frames(header, options, model_fps=24.0):
            requests.append(
                LatentRequest(path, header.size, None, False, False, path.parent, frames)
            )
    return requests


def timed(load, requests: list[LatentRequest]) -> tuple[float, list[torch.Tensor]]:
    """Seconds ``load`` takes over every request, and a sample of each result's pixels (all
    of them would not fit in memory) to compare two ways by."""
    start = time.perf_counter()
    samples = [torch.as_tensor(load(request))[..., ::9, ::9, :].clone() for request in requests]
    return time.perf_counter() - start, samples


def ways(requests: list[LatentRequest]) -> dict[str, tuple]:
    """(clip alone, video once) loaders: decoding only, and the cache's whole load."""
    shared = ClipFrames((r.path, r.frames) for r in requests)
    load = cache_loader(requests)
    return {
        "decoding": (
            lambda r: decode_frames(r.path, list(r.frames)),
            lambda r: shared.frames(r.path, r.frames),
        ),
        "decoding, resizing, to float": (
            lambda r: load_for_cache(r)[0].permute(1, 2, 3, 0),
            lambda r: load(r)[0].permute(1, 2, 3, 0),
        ),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", type=int, nargs=2, default=(640, 360), metavar=("W", "H"))
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--videos", type=int, default=2)
    parser.add_argument("--frames", type=int, default=33, help="clip length (target_frames)")
    parser.add_argument("--stride", type=int, default=12, help="frame_stride between clips")
    parser.add_argument("--keyframe_every", type=int, default=48,
                        help="most frames between keyframes (48: 2 s, as cameras and streaming "
                        "encoders write them)")  # fmt: skip
    args = parser.parse_args()
    options = ClipOptions((args.frames,), "slide", args.stride)
    with tempfile.TemporaryDirectory() as folder:
        paths = write_videos(Path(folder), args.videos, tuple(args.size),
                             round(args.seconds * 24), args.keyframe_every)  # fmt: skip
        requests = requests_of(paths, options)
        print(
            f"{args.videos} videos {args.size[0]}x{args.size[1]}, {args.seconds:g} s at 24 fps, "
            f"{len(requests)} clips of {args.frames} frames (slide, stride {args.stride}), a "
            f"keyframe at least every {args.keyframe_every} frames"
        )
        for name, (alone_load, once_load) in ways(requests).items():
            alone, expected = timed(alone_load, requests)
            once, got = timed(once_load, requests)
            assert all(torch.equal(a, b) for a, b in zip(expected, got, strict=True))
            print(
                f"{name}: each clip alone {alone:6.2f} s, each video once {once:6.2f} s, "
                f"{alone / once:.1f}x"
            )


if __name__ == "__main__":
    main()
