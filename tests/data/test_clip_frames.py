"""The latent cache fill decodes a video once for all its clips (library.data.clip_frames)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch

from library.data import clip_frames
from library.data import video_decode as videos
from library.data.clip_frames import ClipFrames
from library.data.dataset import TrainData
from library.data.latent_cache import LatentCache
from library.data.samples import cache_loader, latent_requests, load_for_cache
from tests.data.test_video_data import SIZE, _run
from tests.kits import videos as kit


def _slide_data(tmp_path):
    """Two videos (21 and 13 frames) cut by slide into clips of 1 and 5 frames, stride 2."""
    folder = tmp_path / "clips"
    folder.mkdir()
    kit.write_video(folder / "a.mp4", kit.numbered_frames(21, SIZE))
    kit.write_video(folder / "b.webm", kit.numbered_frames(13, SIZE))
    text = (
        f"[general]\nresolution = [96, 64]\nflip_aug = true\n[[datasets]]\n"
        f"video_directory = {str(folder)!r}\ntarget_frames = [1, 5]\n"
        'frame_extraction = "slide"\nframe_stride = 2\n'
    )
    return TrainData(_run(tmp_path, text), seed=0)


def _counting_passes(monkeypatch) -> list:
    """Every pass decode_frames makes over a video file, by path."""
    passes = []
    decode_file = videos._decode_file

    def counted(path, indices):
        passes.append(path.name)
        return decode_file(path, indices)

    monkeypatch.setattr(videos, "_decode_file", counted)
    return passes


def _encode(pixels):  # a per-pixel map: any change of a frame changes the entry
    return pixels * 0.5, pixels.abs() + 0.1


def test_the_cache_fill_decodes_each_video_once_for_all_its_clips(tmp_path, monkeypatch):
    data = _slide_data(tmp_path)
    requests = [r for r in latent_requests(data) if r.frames]
    lengths = {(r.path.name, len(r.frames)) for r in requests}
    assert len(requests) > 4 * len(lengths)  # many clips (and flips) per video and length
    passes = _counting_passes(monkeypatch)
    once = LatentCache("vae", torch.float32, to_disk=False, sample_dims=4)
    once.build(requests, _encode, cache_loader(requests), batch_size=3)
    # one pass per video and clip length (the fill loads one length at a time)
    assert sorted(passes) == sorted(name for name, _ in lengths)
    passes.clear()
    alone = LatentCache("vae", torch.float32, to_disk=False, sample_dims=4)
    alone.build(requests, _encode, load_for_cache, batch_size=3)
    assert len(passes) == len(requests)  # clip by clip: a pass for each
    for request in requests:
        assert torch.equal(once.get(request).mean, alone.get(request).mean)


def test_grouped_clips_are_each_clips_own_frames_under_any_load_order(tmp_path, monkeypatch):
    video = kit.write_video(tmp_path / "v.mp4", kit.numbered_frames(24, SIZE))
    clips = [tuple(range(s, s + 5)) for s in range(0, 20)] * 2  # slide, stride 1, twice each
    monkeypatch.setattr(clip_frames, "GROUP_FRAMES", 8)
    monkeypatch.setattr(clip_frames, "KEEP_GROUPS", 2)
    frames = ClipFrames((video, clip) for clip in clips)
    order = np.random.default_rng(0).permutation(len(clips))
    with ThreadPoolExecutor(4) as pool:
        got = list(pool.map(lambda i: frames.frames(video, clips[i]), order))
    for i, clip in zip(order, got, strict=True):
        assert [kit.frame_index(f) for f in clip] == list(clips[i])
        assert np.array_equal(clip, videos.decode_frames(video, list(clips[i])))
    assert frames.decodes < len(clips)
    assert not frames._held  # every group let go once all its clips were loaded
