"""musubi-tuner's dataset config words: what its image datasets call our subset keys, its video
datasets' keys (our subset keys of the same names), and the keys of its FramePack datasets,
which difftune knows and refuses.

musubi-tuner (kohya's trainer for the video and edit models) writes a dataset as one table with
no subsets: ``[[datasets]]`` with ``image_directory`` (or ``image_jsonl_file``),
``cache_directory``, ``num_repeats``, ``control_directory`` and the [general] keys it shares with
sd-scripts (``resolution``, ``caption_extension``, ``batch_size``, ``enable_bucket``,
``bucket_no_upscale``). The dataset loader reads such a table as a dataset of one subset
(``dataset_loader``); these tables say what its names mean here, and bucketing_defaults gives it
musubi-tuner's bucketing (library.data.buckets) and that bucketing's defaults.
"""

from __future__ import annotations

from library.config.problems import Entry
from library.config.suggest import Origin
from library.config.unsupported import Unsupported
from library.config.unsupported import group as _group

# musubi-tuner's name -> ours. (The older per-model names of the reference-size options are
# the families' own words: their entries' kohya aliases.)
ALIASES: dict[str, str] = {"image_directory": "image_dir", "image_jsonl_file": "metadata_file"}

# The keys a musubi-tuner dataset table names its images or videos with: a [[datasets]] table
# with one of them (after ALIASES) and no subsets is a dataset of one subset.
SOURCE_KEYS = ("image_dir", "metadata_file", "video_directory", "video_jsonl_file")

_FRAMEPACK = "only musubi-tuner's FramePack one-frame training reads it"

UNSUPPORTED: dict[str, Unsupported] = {
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

# musubi-tuner's dataset defaults where they differ from kohya's (its BaseDatasetParams and its
# BucketSelector's step for every image model it trains that difftune trains too).
DEFAULT_RESOLUTION = [960, 544]
DEFAULT_BUCKET_STEP = 16
_KOHYA_RANGE = ("min_bucket_reso", "max_bucket_reso")


def bucketing_defaults(
    fields: dict[str, Entry], origin: Origin, alone: bool, notices: list[str]
) -> None:
    """Give a dataset musubi-tuner's bucketing where it asks for it: a dataset written as
    musubi-tuner writes them (``alone``: no subsets) uses it unless ``bucketing`` says
    otherwise, and a dataset using it takes musubi-tuner's defaults for the keys the user did
    not write. The bucket range keys, which musubi-tuner's rule does not read, get a notice
    when written. ``fields``: the dataset's resolved keys, updated in place."""
    unset = Origin(origin.file, path=origin.path, default=True)
    if "bucketing" not in fields and alone:
        fields["bucketing"] = ("musubi", unset)
    if fields.get("bucketing", (None, None))[0] != "musubi":
        return
    if "resolution" not in fields or fields["resolution"][1].default:
        fields["resolution"] = (list(DEFAULT_RESOLUTION), unset)
    if "bucket_reso_steps" not in fields or fields["bucket_reso_steps"][1].default:
        fields["bucket_reso_steps"] = (DEFAULT_BUCKET_STEP, unset)
    for key in _KOHYA_RANGE:
        if key in fields and not fields[key][1].default:
            value, written = fields.pop(key)
            notices.append(
                f"{written.file}: {written.shown(key)} = {value} is not used by {origin.path}, "
                'which has musubi-tuner\'s bucketing (no bucket range); set bucketing = "kohya" '
                "in it for kohya's"
            )
