"""musubi-tuner's dataset config words: what its image datasets call our subset keys, and the
keys of its video and FramePack datasets, which difftune knows and refuses.

musubi-tuner (kohya's trainer for the video and edit models) writes a dataset as one table with
no subsets: ``[[datasets]]`` with ``image_directory`` (or ``image_jsonl_file``),
``cache_directory``, ``num_repeats``, ``control_directory`` and the [general] keys it shares with
sd-scripts (``resolution``, ``caption_extension``, ``batch_size``, ``enable_bucket``,
``bucket_no_upscale``). The dataset loader reads such a table as a dataset of one subset
(``dataset_loader``); these tables say what its names mean here.
"""

from __future__ import annotations

from library.config.unsupported import Unsupported
from library.config.unsupported import group as _group

# musubi-tuner's name -> ours. (The older per-model names of the reference-size options are
# the families' own words: their entries' kohya aliases.)
ALIASES: dict[str, str] = {"image_directory": "image_dir", "image_jsonl_file": "metadata_file"}

# The keys a musubi-tuner dataset table names its images (or videos) with: a [[datasets]] table
# with one of them (after ALIASES) and no subsets is a dataset of one subset, so a video key is
# refused by name there rather than met with "no subsets".
IMAGE_KEYS = ("image_dir", "metadata_file")
SOURCE_KEYS = (*IMAGE_KEYS, "video_directory", "video_jsonl_file")

_VIDEO = "difftune trains on images; musubi-tuner's video datasets are not supported"
_VIDEO_ONLY = "only musubi-tuner's video datasets read it"
_FRAMEPACK = "only musubi-tuner's FramePack one-frame training reads it"

UNSUPPORTED: dict[str, Unsupported] = {
    **_group("video_directory video_jsonl_file", _VIDEO, planned=False),
    **_group(
        "target_frames frame_extraction frame_stride frame_sample max_frames source_fps",
        _VIDEO_ONLY,
        ignored=True,
    ),
    **_group(
        "fp_latent_window_size fp_1f_clean_indices fp_1f_target_index fp_1f_no_post",
        _FRAMEPACK,
        ignored=True,
    ),
    "multiple_target": Unsupported(
        "several target images per sample (musubi-tuner's layered training) are not supported",
        (False,),
        planned=False,
    ),
}
