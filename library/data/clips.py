"""A video subset's samples: the clips musubi-tuner's frame extraction cuts from its videos.

A video subset (video_directory or video_jsonl_file) lists videos with captions; each video is
probed once by the scan (library.data.videos) and gives one sample per clip that
library.data.frame_extraction cuts from it. A clip is the tuple of the file's frame indices it
trains (presentation order from 0), so loading it, its latent cache entry and its key all name
the same frames.

Decisions:
- Frames kept for the model's frame rate: with source_fps, musubi-tuner's frame dropping (a
  variable-frame-rate file by its frame times); without it every frame
  (library.data.videos.clips_of).
- A video file's probe (it decodes every frame) is kept in the subset's scan index
  (library.data.scan_index) beside its images' headers, so a rerun over unchanged videos
  decodes none of them before training. The others are probed on the scan's threads.
- A video shorter than every clip length gives no sample (as in musubi-tuner); the plan counts
  such videos so a wrong target_frames is seen.
- Every frame of a clip goes through the image path's resize and crop, and one augmentation
  draw (flip, crop place, hue) serves the whole clip, so its frames stay aligned.
"""

from __future__ import annotations

import dataclasses
import os
import stat
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from library.config.dataset_schema import SubsetConfig
from library.data.augment import AugmentDraws, shift_hue
from library.data.folders import FolderScan, ImageItem, caption_lines, is_quiet, missing_folder
from library.data.header_scan import SCAN_THREADS
from library.data.images import LoadedImage, crop_geometry
from library.data.metadata_files import parse_json, read_text
from library.data.scan_index import ScanIndex
from library.data.video_decode import decode_frames
from library.data.videos import (
    VideoHeader,
    clips_of,
    frame_files,
    is_video_path,
    probe_video,
)
from library.errors import DataError

# The frame rate clips are cut for when source_fps is set, unless the run names its family's
# (ModelFamily.FRAME_RATE): Wan 2.1's
MODEL_FPS = 16.0


@dataclass(frozen=True)
class ClipOptions:
    """A video subset's frame extraction keys (musubi-tuner's words)."""

    target_frames: tuple[int, ...] = (1,)
    frame_extraction: str = "head"
    frame_stride: int = 1
    frame_sample: int = 1
    max_frames: int = 129
    source_fps: float | None = None

    @classmethod
    def from_subset(cls, subset: SubsetConfig) -> ClipOptions:
        return cls(
            tuple(subset.target_frames),
            subset.frame_extraction,
            subset.frame_stride,
            subset.frame_sample,
            subset.max_frames,
            subset.source_fps,
        )


def _video_header(values: object) -> VideoHeader | None:
    """The VideoHeader an index entry holds (its fields by name), None when the entry is not
    one (a damaged entry, or one written with other fields, is probed again, never trusted)."""
    if not isinstance(values, dict):
        return None
    try:
        fields = {k: tuple(v) if isinstance(v, list) else v for k, v in values.items()}
        header = VideoHeader(**fields)
    except TypeError:
        return None
    if dataclasses.asdict(header).keys() != values.keys() or not isinstance(header.frames, int):
        return None
    return header if header.frames > 0 else None


def _video_values(header: VideoHeader) -> dict:
    """A probe as an index entry holds it: its fields by name, JSON values."""
    return {
        k: list(v) if isinstance(v, tuple) else v for k, v in dataclasses.asdict(header).items()
    }


def probed(path: Path, index: ScanIndex | None, key: str) -> VideoHeader:
    """The probe of the video at ``path``: from the subset's scan ``index`` (by ``key``) when
    the file is unchanged since, else probed now (and kept in the index). A folder of frames
    is probed every time (its frames' headers only: cheap). DataError as probe_video."""
    try:
        info = os.stat(path)
    except OSError:
        info = None  # missing: probe_video names it
    indexed = index is not None and info is not None and stat.S_ISREG(info.st_mode)
    if indexed:
        values = index.known_video(key, info)
        header = None if values is None else _video_header(values)
        if header is not None:
            index.keep_video(key, info, values)
            return header
    header = probe_video(path)
    if indexed:
        index.record_video(key, info, _video_values(header))
    return header


def probe_all(
    paths: Sequence[Path], index: ScanIndex | None, keys: Sequence[str]
) -> list[VideoHeader | DataError]:
    """The probe of each video of ``paths`` (``probed``, by ``keys``), in order, or the
    DataError probing it raised; on a pool of threads, as FFmpeg decodes without the GIL."""

    def one(pair: tuple[Path, str]) -> VideoHeader | DataError:
        try:
            return probed(pair[0], index, pair[1])
        except DataError as error:
            return error

    pairs = list(zip(paths, keys, strict=True))
    if len(pairs) <= 1:
        return [one(pair) for pair in pairs]
    with ThreadPoolExecutor(SCAN_THREADS, thread_name_prefix="difftune-probe") as pool:
        return list(pool.map(one, pairs))


def clip_frames(
    header: VideoHeader, options: ClipOptions, model_fps: float = MODEL_FPS
) -> list[tuple[int, ...]]:
    """Every clip of a probed video as the file's frame indices, in musubi-tuner's order."""
    clips = clips_of(
        header,
        model_fps,
        target_frames=options.target_frames,
        frame_extraction=options.frame_extraction,
        frame_stride=options.frame_stride,
        frame_sample=options.frame_sample,
        max_frames=options.max_frames,
        source_fps=options.source_fps,
    )
    return [clip.source_frames for clip in clips]


def _is_frame_folder(entry: os.DirEntry) -> bool:
    return entry.is_dir() and not entry.name.startswith(".") and bool(frame_files(entry.path))


def _sidecar_caption(video: Path, subset: SubsetConfig) -> str:
    """A video's caption: ``<name without extension><caption_extension>`` beside it (a folder
    of frames: ``<folder name><caption_extension>``), else the class tokens."""
    stem = video.name if video.is_dir() else video.stem
    path = video.with_name(stem + subset.caption_extension)
    if not path.exists():
        return subset.class_tokens or ""
    lines = caption_lines(path)
    return lines if subset.enable_wildcard else lines.partition("\n")[0]


def _folder_items(subset: SubsetConfig) -> FolderScan:
    folder = Path(subset.video_directory)
    if not folder.is_dir():
        raise DataError(
            f"video_directory {subset.video_directory} {missing_folder(folder)}; fix the path"
        )
    videos, ignored = [], []
    with os.scandir(folder) as entries:
        for entry in entries:
            if is_video_path(Path(entry.name)) or _is_frame_folder(entry):
                videos.append(Path(entry.path))
            elif not is_quiet(entry, subset.caption_extension):
                ignored.append(Path(entry.path))
    videos.sort()
    if not videos:
        raise DataError(
            f"video_directory {subset.video_directory} has no videos (mp4, webm, mov, gif, ... "
            "or folders of frames); add videos or remove the dataset"
        )
    items = [
        ImageItem(v, _sidecar_caption(v, subset), subset.is_reg, subset.video_directory)
        for v in videos
    ]
    return FolderScan(items, tuple(sorted(ignored)))


def _listed_video(name: str, listing: Path) -> Path:
    """The video a video_jsonl_file line names: an absolute path as written; a relative one
    from the working directory, as musubi-tuner opens it, else from the JSONL's folder (where
    difftune's other metadata files start), so a listing written for either tool loads."""
    path = Path(name)
    if path.is_absolute() or path.exists():
        return path
    return listing.parent / path


def _jsonl_record(record: object, path: Path, number: int, is_reg: bool) -> ImageItem:
    """One line of musubi-tuner's video JSONL: ``video_path`` and ``caption`` (both required,
    as musubi-tuner reads them); ``control_path`` (control videos) is not trained."""
    where = f"video_jsonl_file {path} line {number}"
    if not isinstance(record, dict) or not isinstance(record.get("video_path"), str):
        raise DataError(f'{where} names no video: write {{"video_path": ..., "caption": ...}}')
    if "control_path" in record:
        raise DataError(
            f'{where} has a "control_path" (control videos), which difftune does not train; '
            "remove it"
        )
    caption = record.get("caption")
    if not isinstance(caption, str):
        raise DataError(f'{where} needs a "caption" (text); write one or remove the line')
    video = _listed_video(record["video_path"], path)
    return ImageItem(video, caption.strip(), is_reg, str(path.parent))


def _jsonl_items(subset: SubsetConfig) -> list[ImageItem]:
    path = Path(subset.video_jsonl_file)
    items = []
    for number, line in enumerate(read_text(path).split("\n"), start=1):
        if line.strip():
            record = parse_json(line, path, number)
            items.append(_jsonl_record(record, path, number, subset.is_reg))
    if not items:
        raise DataError(f"video_jsonl_file {path} lists no videos; add lines or remove it")
    return items


def video_items(subset: SubsetConfig) -> FolderScan:
    """The videos of a video subset with their raw captions, in a fixed order, and the
    entries of its folder that are neither videos nor captions."""
    if subset.video_directory:
        return _folder_items(subset)
    return FolderScan(_jsonl_items(subset), ())


def load_training_clip(
    path: Path, frames: Sequence[int], size: tuple[int, int], draws: AugmentDraws | None = None
) -> LoadedImage:
    """The ``frames`` of the video at ``path`` at training ``size`` = (W, H), each covered and
    cropped like an image (library.data.images.load_training_image) with one draw for the whole
    clip: pixels float32 [3, F, H, W] in [-1, 1]. DataError naming the file when it cannot be
    decoded now."""
    return fit_clip(decode_frames(path, list(frames)), size, draws)


def fit_clip(
    decoded: np.ndarray, size: tuple[int, int], draws: AugmentDraws | None = None
) -> LoadedImage:
    """A clip's decoded frames (uint8 RGB [F, h, w, 3], as decode_frames gives them) at
    training ``size``, as load_training_clip makes them."""
    height, width = decoded.shape[1:3]
    resized, (left, top) = crop_geometry(
        (width, height), size, draws.crop_fraction if draws else None
    )
    box = (left, top, left + size[0], top + size[1])
    fitted = []
    for frame in decoded:
        image = Image.fromarray(frame)
        if resized != image.size:
            image = image.resize(resized, Image.Resampling.LANCZOS)
        fitted.append(np.asarray(image.crop(box), dtype=np.uint8))
    pixels = torch.from_numpy(np.stack(fitted)).permute(3, 0, 1, 2).float()  # [3, F, H, W]
    if draws is not None and draws.flip:
        pixels = pixels.flip(-1)
        left = resized[0] - left - size[0]
    if draws is not None and draws.hue_shift != 0:
        pixels = torch.stack([shift_hue(f, draws.hue_shift) for f in pixels.unbind(1)], dim=1)
    return LoadedImage(pixels / 127.5 - 1.0, None, (height, width), (top, left))
