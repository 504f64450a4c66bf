"""Video subsets through the data path: musubi-tuner's video dataset configs scanned into clips,
clips grouped by frame count beside images, loaded as [3, F, H, W] with the right frames, bad
videos named before training, and clips cached per clip from the VAE's encode of their frames.

Every expectation is computed here from the test videos' own numbering (tests.kits.videos), not
read back from the code under test.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from library.config.loader import load_config
from library.data.dataset import TrainData
from library.data.latent_cache import LatentCache
from library.data.plan import plan_lines
from library.data.samples import SampleSource, latent_requests, load_for_cache
from library.data.video_decode import decode_frames
from library.errors import DataError
from tests.data.data_helpers import write_image
from tests.kits import videos as kit

SIZE = (96, 64)  # (width, height) of the test videos and the datasets' resolution


def _run(tmp_path: Path, dataset_text: str):
    dataset = tmp_path / "dataset.toml"
    dataset.write_text(dataset_text)
    run = tmp_path / "run.toml"
    run.write_text(f'pretrained_model_name_or_path = "m"\ndataset_config = {str(dataset)!r}\n')
    return load_config(str(run)).datasets


def _clip_folder(tmp_path: Path) -> Path:
    """Two numbered videos (13 and 9 frames) with captions, and a 3-frame one."""
    folder = tmp_path / "clips"
    folder.mkdir()
    kit.write_video(folder / "a.mp4", kit.numbered_frames(13, SIZE))
    (folder / "a.txt").write_text("clip a")
    kit.write_video(folder / "b.webm", kit.numbered_frames(9, SIZE))
    (folder / "b.txt").write_text("clip b")
    kit.write_video(folder / "short.mp4", kit.numbered_frames(3, SIZE))
    return folder


def _video_dataset(folder: Path, images: Path, extraction: str = "chunk") -> str:
    return (
        '[general]\ncaption_extension = ".txt"\nresolution = [96, 64]\n'
        f"[[datasets]]\nvideo_directory = {str(folder)!r}\ntarget_frames = [1, 5]\n"
        f'frame_extraction = "{extraction}"\n'
        f"[[datasets]]\nimage_directory = {str(images)!r}\n"
    )


@pytest.fixture
def data(tmp_path):
    folder = _clip_folder(tmp_path)
    write_image(tmp_path / "stills" / "s.png", size=SIZE)
    return TrainData(_run(tmp_path, _video_dataset(folder, tmp_path / "stills")), seed=0)


def _expected_chunks(frames: int, lengths=(1, 5)) -> list[tuple[int, ...]]:
    """musubi-tuner's chunk extraction written out: back-to-back clips of each length."""
    return [
        tuple(range(start, start + n)) for n in lengths for start in range(0, frames - n + 1, n)
    ]


def test_a_musubi_video_dataset_scans_into_its_clips_beside_an_image_dataset(data):
    videos, stills = data.scanned
    clips = {(image.item.path.name, image.frames) for image in videos.images}
    expected = (
        {("a.mp4", c) for c in _expected_chunks(13)}
        | {("b.webm", c) for c in _expected_chunks(9)}
        | {("short.mp4", c) for c in _expected_chunks(3, (1,))}
    )
    assert clips == expected
    captions = {image.item.path.name: image.item.caption for image in videos.images}
    assert captions["a.mp4"] == "clip a" and captions["b.webm"] == "clip b"
    assert [image.frame_count for image in stills.images] == [1]
    # a clip group holds clips of one frame count; images have groups of their own
    counts = {(g.dataset, g.frames): len(g.samples) for g in data.groups}
    assert counts == {(0, 1): 13 + 9 + 3, (0, 5): 2 + 1, (1, 1): 1}
    assert videos.short_videos == ()


def test_a_clip_sample_is_its_frames_in_order(data):
    videos = data.scanned[0]
    source = SampleSource()
    from library.data.samples import TrainSamples

    samples = TrainSamples(data, source)
    for epoch, ref in [(0, ref) for batch in data.schedule.micro_batches(0, 0) for ref in batch]:
        group = data.groups[ref.dataset]
        image = data.scanned[group.dataset].images[group.samples[ref.index].item]
        if group.dataset != 0 or image.frame_count == 1:
            continue
        pixels = samples[(epoch, ref)]["pixel_values"]
        assert pixels.shape == (3, 5, SIZE[1], SIZE[0])
        as_uint8 = ((pixels + 1) * 127.5).round().clamp(0, 255).byte().permute(1, 2, 3, 0)
        got = [kit.frame_index(frame.numpy()) for frame in as_uint8]
        assert got == list(image.frames)
    assert any(image.frame_count == 5 for image in videos.images)


def test_short_videos_and_other_files_are_counted_and_frame_folders_train(tmp_path):
    folder = _clip_folder(tmp_path)
    kit.write_frame_folder(folder / "frames", kit.numbered_frames(6, SIZE))
    (folder / "frames.txt").write_text("from frames")
    (folder / "notes.pdf").write_bytes(b"%PDF")
    write_image(tmp_path / "stills" / "s.png", size=SIZE)
    text = _video_dataset(folder, tmp_path / "stills").replace("[1, 5]", "[5]")
    videos = TrainData(_run(tmp_path, text), seed=0).scanned[0]
    assert videos.short_videos == (folder / "short.mp4",)
    assert videos.ignored == (folder / "notes.pdf",)
    (from_frames,) = [i for i in videos.images if i.item.path.name == "frames"]
    assert from_frames.frames == (0, 1, 2, 3, 4) and from_frames.item.caption == "from frames"
    # a folder of frames is cached by its frames' bytes: another frame, another key
    from library.data.content_hash import file_digest

    before = file_digest(folder / "frames")
    kit.write_frame_folder(folder / "frames", kit.numbered_frames(6, SIZE)[::-1])
    assert file_digest(folder / "frames") != before


def test_a_video_jsonl_file_lists_videos_by_path_with_captions(tmp_path):
    folder = _clip_folder(tmp_path)
    listing = tmp_path / "clips.jsonl"
    listing.write_text(
        '{"video_path": "clips/a.mp4", "caption": "from the list"}\n'
        f'{{"video_path": {str(folder / "b.webm")!r}, "caption": "absolute"}}\n'.replace("'", '"')
    )
    text = f"[[datasets]]\nvideo_jsonl_file = {str(listing)!r}\nresolution = [96, 64]\n"
    text += 'target_frames = [9]\nframe_extraction = "head"\n'
    (scanned,) = TrainData(_run(tmp_path, text), seed=0).scanned
    got = [(i.item.path.name, i.item.caption, i.frames) for i in scanned.images]
    assert got == [
        ("a.mp4", "from the list", tuple(range(9))),
        ("b.webm", "absolute", tuple(range(9))),
    ]


@pytest.mark.parametrize("broken", ["corrupt", "truncated", "zero"])
def test_a_broken_video_is_named_before_training_or_left_out(tmp_path, broken):
    folder = _clip_folder(tmp_path)
    writer = {
        "corrupt": kit.write_corrupt,
        "truncated": kit.write_truncated,
        "zero": kit.write_zero_frames,
    }[broken]
    bad = writer(folder / "bad.mp4")
    text = f"[[datasets]]\nvideo_directory = {str(folder)!r}\nresolution = [96, 64]\n"
    with pytest.raises(DataError) as caught:
        TrainData(_run(tmp_path, text), seed=0)
    message = str(caught.value)
    assert str(bad) in message and "\n" not in message and "skip_bad_images" in message
    kept = TrainData(_run(tmp_path, text), seed=0, skip_bad_images=True)
    assert {i.item.path.name for i in kept.scanned[0].images} == {"a.mp4", "b.webm", "short.mp4"}
    assert len(kept.skipped_images) == 1 and str(bad) in kept.skipped_images[0]


def test_an_image_subset_option_on_a_video_subset_is_named(tmp_path):
    folder = _clip_folder(tmp_path)
    text = f"[[datasets]]\nvideo_directory = {str(folder)!r}\nalpha_mask = true\n"
    with pytest.raises(Exception, match="alpha_mask is for images"):
        _run(tmp_path, text)


def test_clips_are_cached_per_clip_from_the_vaes_encode_of_their_frames(data, tmp_path):
    requests = [r for r in latent_requests(data) if len(r.frames) == 5]
    assert len(requests) == 3
    cache = LatentCache("vae", torch.float32, to_disk=True, sample_dims=4)
    torch.manual_seed(0)
    weights = torch.randn(4, 3)

    def encode(pixels):  # [B, 3, F, H, W] -> a per-frame linear map: frames stay visible
        assert pixels.dim() == 5
        mean = torch.einsum("oc,bcfhw->bofhw", weights, pixels)
        return mean, mean.abs() + 0.1

    cache.build(requests, encode, load_for_cache, batch_size=2)
    keys = {cache.key(r) for r in requests}
    assert len(keys) == 3  # two clips of a.mp4 and one of b.webm: each its own entry
    for request in requests:
        # the clip's frames as PyAV decodes them (at the dataset's resolution: no resizing)
        frames = decode_frames(request.path, list(request.frames))
        pixels = torch.from_numpy(frames).permute(3, 0, 1, 2).float() / 127.5 - 1
        cached = cache.get(request).mean
        expected = torch.einsum("oc,cfhw->ofhw", weights, pixels)
        torch.testing.assert_close(cached, expected, atol=1e-5, rtol=1e-5)
        shown = [kit.frame_index(f) for f in frames]
        assert shown == list(request.frames)  # and they are the clip's frames
        fresh = LatentCache("vae", torch.float32, to_disk=True, sample_dims=4)
        assert torch.equal(fresh.get(request).mean, cached)  # read back and verified from disk


def test_the_plan_counts_clips_per_bucket_and_frames(tmp_path):
    folder = _clip_folder(tmp_path)
    write_image(tmp_path / "stills" / "s.png", size=SIZE)
    text = _video_dataset(folder, tmp_path / "stills").replace("[1, 5]", "[5, 9]")
    data = TrainData(_run(tmp_path, text), seed=0)
    lines = plan_lines(data)
    # a: 13 frames -> 2 chunks of 5 and 1 of 9; b: 9 frames -> 1 of 5, 1 of 9; short: none
    assert f"  {folder}: 5 clips from 2 videos x 1 repeat" in lines
    buckets = [line.split() for line in lines if line.startswith("      96x64")]
    assert [b[:4] for b in buckets] == [
        ["96x64", "x5", "3", "clips"],
        ["96x64", "x9", "2", "clips"],
    ]
    assert any("1 videos are shorter than every clip length" in line for line in lines)
    frames = {(b.size, b.frames): b.images for b in data.stats.datasets[0].buckets}
    assert frames == {((96, 64), 5): 3, ((96, 64), 9): 2}


def test_the_scan_index_keeps_video_probes_and_probes_only_a_changed_video(tmp_path, monkeypatch):
    import library.data.clips as clips

    folder = _clip_folder(tmp_path)
    text = f"[[datasets]]\nvideo_directory = {str(folder)!r}\nresolution = [96, 64]\n"
    text += "target_frames = [1, 5]\n"
    datasets = _run(tmp_path, text)
    probes = []
    real = clips.probe_video
    monkeypatch.setattr(clips, "probe_video", lambda path: probes.append(path.name) or real(path))

    def scan():
        probes.clear()
        data = TrainData(datasets, seed=0, cache_dir=str(tmp_path / "cache"))
        return data.scanned[0], sorted(probes)

    first, probed = scan()
    assert probed == ["a.mp4", "b.webm", "short.mp4"] and first.indexed == 0
    again, probed = scan()
    assert probed == [] and again.indexed == 3
    assert [(i.key, i.size, i.frames) for i in again.images] == [
        (i.key, i.size, i.frames) for i in first.images
    ]
    kit.write_video(folder / "b.webm", kit.numbered_frames(5, SIZE))  # edited: 5 frames now
    edited, probed = scan()
    assert probed == ["b.webm"] and edited.indexed == 2
    assert max(len(i.frames) for i in edited.images if i.item.path.name == "b.webm") == 5


def test_a_rotated_video_trains_as_displayed(tmp_path):
    folder = tmp_path / "rotated"
    folder.mkdir()
    # stored 64 wide and 96 high, shown turned a quarter: 96 x 64 as the dataset's resolution
    kit.write_video(folder / "r.mp4", kit.numbered_frames(5, (64, 96)), rotation=90)
    text = f"[[datasets]]\nvideo_directory = {str(folder)!r}\nresolution = [96, 64]\n"
    text += "target_frames = [5]\n"
    data = TrainData(_run(tmp_path, text), seed=0)
    (clip,) = data.scanned[0].images
    assert clip.size == (96, 64) and clip.bucket == (96, 64)
    (batch,) = list(data.loader(0, 0))
    frames = ((batch["pixel_values"][0] + 1) * 127.5).round().byte().permute(1, 2, 3, 0)
    assert [kit.frame_index(f.numpy()) for f in frames] == [0, 1, 2, 3, 4]
    # FFmpeg's angle 90 is counter-clockwise: the stored top-left corner is shown bottom left
    assert {kit.marker_corner(f.numpy()) for f in frames} == {"bottom-left"}


def test_a_video_that_breaks_while_the_run_trains_is_a_stand_in_of_its_clips_shape(tmp_path):
    folder = _clip_folder(tmp_path)
    text = f"[[datasets]]\nvideo_directory = {str(folder)!r}\nresolution = [96, 64]\n"
    text += 'target_frames = [5]\nframe_extraction = "chunk"\n'
    data = TrainData(_run(tmp_path, text), seed=0)
    (folder / "a.mp4").write_bytes(b"gone")  # broken after the scan
    batches = list(data.loader(0, 0))
    broken = [b for b in batches if b["unreadable"]]
    assert broken and all("a.mp4" in problem for b in broken for problem in b["unreadable"])
    for batch in broken:
        assert batch["pixel_values"].shape[1:] == (3, 5, 64, 96)
        assert batch["loss_weights"].tolist() == [0.0]


# rates whose ratio is exact in binary: musubi-tuner sums the float step frame by frame
@pytest.mark.parametrize(("model_fps", "source_fps", "step"), [(16.0, 64.0, 4), (24.0, 48.0, 2)])
def test_source_fps_resamples_to_the_models_frame_rate(tmp_path, model_fps, source_fps, step):
    folder = tmp_path / "fast"
    folder.mkdir()
    kit.write_video(folder / "f.mp4", kit.numbered_frames(20, SIZE), fps=int(source_fps))
    text = f"[[datasets]]\nvideo_directory = {str(folder)!r}\nresolution = [96, 64]\n"
    text += f"target_frames = [5]\nsource_fps = {source_fps}\n"
    data = TrainData(_run(tmp_path, text), seed=0, frame_rate=model_fps)
    (clip,) = data.scanned[0].images
    # played at the model's rate, every (source / model)-th frame is kept
    assert clip.frames == tuple(range(0, 5 * step, step))


def test_the_validation_split_holds_out_whole_videos(tmp_path):
    folder = _clip_folder(tmp_path)
    for n in range(3):
        kit.write_video(folder / f"more{n}.mp4", kit.numbered_frames(9, SIZE))
    text = f"[[datasets]]\nvideo_directory = {str(folder)!r}\nresolution = [96, 64]\n"
    text += 'target_frames = [1, 5]\nframe_extraction = "chunk"\nvalidation_split = 0.4\n'
    (scanned,) = TrainData(_run(tmp_path, text), seed=0).scanned
    held = {i.item.path.name for i in scanned.validation}
    trained = {i.item.path.name for i in scanned.images}
    assert held and trained and not held & trained  # no video on both sides
    # 6 videos, 0.4 held out: round(2.4) = 2 whole videos, every clip of each
    assert len(held) == 2
    clips = {"a.mp4": 13 + 2, "b.webm": 9 + 1, "short.mp4": 3}
    expected = sum(clips.get(name, 9 + 1) for name in held)
    assert len(scanned.validation) == expected


def test_an_index_entry_that_is_not_a_probe_is_probed_again(tmp_path, monkeypatch):
    import hashlib
    import json

    import library.data.clips as clips

    folder = _clip_folder(tmp_path)
    text = f"[[datasets]]\nvideo_directory = {str(folder)!r}\nresolution = [96, 64]\n"
    datasets = _run(tmp_path, text)
    first = TrainData(datasets, seed=0, cache_dir=str(tmp_path / "cache")).scanned[0]
    (index,) = (tmp_path / "cache" / "scan").iterdir()
    head, body = index.read_bytes().split(b"\n", 1)
    parsed = json.loads(body)
    # a well-formed index (checksum and all) whose entries hold other fields than a probe's
    parsed["videos"]["values"] = [{"frames": 3, "colour": "red"} for _ in parsed["videos"]["names"]]
    body = json.dumps(parsed).encode()
    header = json.loads(head)
    header["checksum"] = hashlib.blake2b(body, digest_size=16).hexdigest()
    index.write_bytes(json.dumps(header).encode() + b"\n" + body)
    probes = []
    real = clips.probe_video
    monkeypatch.setattr(clips, "probe_video", lambda path: probes.append(path.name) or real(path))
    again = TrainData(datasets, seed=0, cache_dir=str(tmp_path / "cache")).scanned[0]
    assert sorted(probes) == ["a.mp4", "b.webm", "short.mp4"] and again.indexed == 0
    assert [i.frames for i in again.images] == [i.frames for i in first.images]


def test_a_video_jsonl_as_musubi_tuner_reads_it(tmp_path, monkeypatch):
    """musubi-tuner opens a line's video_path as written: a relative one from the working
    directory. A name found only beside the JSONL is read from there (difftune's metadata
    files); "caption" is required and "control_path" is named, each in one line."""
    work = tmp_path / "work"
    for folder in (work / "videos", tmp_path / "lists" / "videos"):
        folder.mkdir(parents=True)
    kit.write_video(work / "videos" / "a.mp4", kit.numbered_frames(5, SIZE))
    kit.write_video(tmp_path / "lists" / "b.mp4", kit.numbered_frames(5, SIZE))
    kit.write_video(tmp_path / "lists" / "videos" / "a.mp4", kit.numbered_frames(7, SIZE))
    listing = tmp_path / "lists" / "clips.jsonl"
    lines = ['{"video_path": "videos/a.mp4", "caption": "A caption for video1"}']
    lines.append('{"video_path": "b.mp4", "caption": "A caption for video2"}')
    listing.write_text("\n".join(lines) + "\n")
    monkeypatch.chdir(work)
    text = f"[[datasets]]\nvideo_jsonl_file = {str(listing)!r}\nresolution = [96, 64]\n"
    text += 'target_frames = [5]\nframe_extraction = "head"\n'
    (scanned,) = TrainData(_run(tmp_path, text), seed=0).scanned
    got = {i.item.path.resolve(): i.item.caption for i in scanned.images}
    assert got == {
        (work / "videos" / "a.mp4").resolve(): "A caption for video1",  # not lists/videos/a.mp4
        (tmp_path / "lists" / "b.mp4").resolve(): "A caption for video2",
    }
    for line, named in (
        ('{"video_path": "b.mp4"}', '"caption"'),
        ('{"video_path": "b.mp4", "caption": "c", "control_path": "b.mp4"}', '"control_path"'),
    ):
        listing.write_text(line + "\n")
        with pytest.raises(DataError) as caught:
            TrainData(_run(tmp_path, text), seed=0)
        message = str(caught.value)
        assert named in message and str(listing) in message and "\n" not in message


def test_the_plan_gives_each_clip_buckets_tokens(tmp_path):
    """The stand-in clip family's denoiser sees every latent position: 96x64 pixels are 12x8
    latents a frame, and clips of 5 and 9 frames are 2 and 3 latent frames (1 + (F - 1) / 4)."""
    from tests.kits.video_latents import VideoLatentFamily

    folder = _clip_folder(tmp_path)
    write_image(tmp_path / "stills" / "s.png", size=SIZE)
    text = _video_dataset(folder, tmp_path / "stills").replace("[1, 5]", "[5, 9]")
    data = TrainData(_run(tmp_path, text), seed=0, tokens_of=VideoLatentFamily.tokens_per_sample)
    clips, images = data.stats.datasets
    assert {b.frames: b.tokens for b in clips.buckets} == {5: 12 * 8 * 2, 9: 12 * 8 * 3}
    assert [b.tokens for b in images.buckets] == [12 * 8]
    rows = [line.split() for line in plan_lines(data) if line.startswith("      96x64")]
    assert [row[-2:] for row in rows] == [["192", "tokens"], ["288", "tokens"]]
