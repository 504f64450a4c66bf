"""musubi-tuner's dataset config files load as they are: a [[datasets]] table that names its
images (image_directory / image_jsonl_file) is a dataset of one subset, its reference-image keys
(control_directory and the options sizing the references) are read, its video datasets load with
their frame keys, and its FramePack keys are dropped by name.

The file below is shaped like the dataset configs musubi-tuner's docs and its GUI write for the
edit models: [general] with resolution, caption_extension, batch_size, enable_bucket and
bucket_no_upscale; datasets with image_directory, cache_directory, control_directory and
num_repeats (and the older per-model names of no_resize_control / control_resolution).
"""

from __future__ import annotations

from config_helpers import error_of

from library.config.loader import load_config

HEAD = 'pretrained_model_name_or_path = "m"\n'

MUSUBI = """\
[general]
resolution = [960, 544]
caption_extension = ".txt"
batch_size = 2
enable_bucket = true
bucket_no_upscale = false

[[datasets]]
image_directory = "/data/edit/targets"
cache_directory = "/data/edit/cache"
control_directory = "/data/edit/controls"
num_repeats = 3

[[datasets]]
image_jsonl_file = "/data/edit/pairs.jsonl"
cache_directory = "/data/edit/cache_jsonl"
qwen_image_edit_control_resolution = [1024, 1024]
control_count_per_image = 2
resolution = [1024, 1024]
batch_size = 1
"""


def _load(write_toml, dataset_text: str):
    dataset = write_toml("dataset.toml", dataset_text)
    return load_config(write_toml("run.toml", HEAD + f"dataset_config = {dataset!r}\n"))


def test_a_musubi_dataset_config_loads_as_datasets_of_one_subset(write_toml):
    config = _load(write_toml, MUSUBI)
    first, second = config.datasets
    assert (first.resolution, first.batch_size, first.enable_bucket) == ([960, 544], 2, True)
    assert len(first.subsets) == 1
    subset = first.subsets[0]
    assert subset.image_dir == "/data/edit/targets"
    assert subset.cache_directory == "/data/edit/cache"
    assert subset.control_directory == "/data/edit/controls"
    assert (subset.num_repeats, subset.caption_extension) == (3, ".txt")
    assert not subset.no_resize_control and subset.control_resolution is None
    # the dataset's own keys win over [general]; musubi-tuner's per-model key names the same
    (jsonl,) = second.subsets
    assert (second.resolution, second.batch_size) == ([1024, 1024], 1)
    assert jsonl.metadata_file == "/data/edit/pairs.jsonl"
    assert jsonl.control_resolution == [1024, 1024]
    assert jsonl.control_count_per_image == 2


def test_kontext_and_qwen_names_of_no_resize_control_mean_it(write_toml):
    for name in ("flux_kontext_no_resize_control", "qwen_image_edit_no_resize_control"):
        text = f'[[datasets]]\nimage_directory = "t"\ncontrol_directory = "c"\n{name} = true\n'
        (subset,) = _load(write_toml, text).datasets[0].subsets
        assert subset.no_resize_control, name


def test_problems_are_named_where_the_musubi_table_is(write_toml):
    dataset = write_toml("dataset.toml", '[[datasets]]\nimage_directory = "t"\nnum_repeat = 2\n')
    path = write_toml("run.toml", HEAD + f"dataset_config = {dataset!r}\n")
    assert 'unknown key "num_repeat" in datasets[0]; did you mean "num_repeats"?' in error_of(path)


# musubi-tuner's video dataset example (its docs/dataset_config.md), beside an image dataset
MUSUBI_VIDEO = """\
[general]
resolution = [960, 544]
caption_extension = ".txt"
batch_size = 1
enable_bucket = true

[[datasets]]
video_directory = "/data/clips"
cache_directory = "/data/clips_cache"
target_frames = [1, 25, 45]
frame_extraction = "slide"
frame_stride = 10
max_frames = 129
source_fps = 30.0

[[datasets]]
video_jsonl_file = "/data/clips.jsonl"
target_frames = [81]
frame_extraction = "uniform"
frame_sample = 4

[[datasets]]
image_directory = "/data/stills"
"""


def test_musubi_video_datasets_load_with_their_frame_keys_beside_images(write_toml):
    slide, uniform, stills = _load(write_toml, MUSUBI_VIDEO).datasets
    (clips,) = slide.subsets
    assert clips.video_directory == "/data/clips" and clips.is_video
    assert clips.target_frames == [1, 25, 45] and clips.frame_extraction == "slide"
    assert (clips.frame_stride, clips.max_frames, clips.source_fps) == (10, 129, 30.0)
    assert clips.cache_directory == "/data/clips_cache"
    (listed,) = uniform.subsets
    assert listed.video_jsonl_file == "/data/clips.jsonl" and listed.frame_sample == 4
    assert (listed.target_frames, listed.frame_extraction) == ([81], "uniform")
    (images,) = stills.subsets
    assert not images.is_video and images.target_frames == [1]
    assert slide.bucketing == "musubi" and slide.resolution == [960, 544]


def test_a_subset_of_images_and_videos_and_a_bad_extraction_are_named(write_toml):
    both = '[[datasets]]\nvideo_directory = "v"\nimage_directory = "i"\n'
    path = write_toml("run.toml", HEAD + f"dataset_config = {write_toml('d.toml', both)!r}\n")
    assert "image_dir and video_directory are both set" in error_of(path)
    bad = '[[datasets]]\nvideo_directory = "v"\nframe_extraction = "every"\n'
    path = write_toml("run.toml", HEAD + f"dataset_config = {write_toml('e.toml', bad)!r}\n")
    assert "frame_extraction" in error_of(path) and "every" in error_of(path)


def test_reference_sizing_options_need_references_and_may_be_combined(write_toml):
    dataset = write_toml(
        "a.toml", '[[datasets]]\nimage_directory = "t"\nno_resize_control = true\n'
    )
    path = write_toml("run.toml", HEAD + f"dataset_config = {dataset!r}\n")
    assert "no_resize_control sizes or counts reference images" in error_of(path)
    assert "set control_directory or remove it" in error_of(path)
    # both, as musubi-tuner's files may have them: control_resolution is then the largest area
    # a reference keeps (tests/data/test_references.py)
    text = (
        '[[datasets]]\nimage_directory = "t"\ncontrol_directory = "c"\n'
        "no_resize_control = true\ncontrol_resolution = [512, 512]\n"
    )
    (subset,) = _load(write_toml, text).datasets[0].subsets
    assert subset.no_resize_control and subset.control_resolution == [512, 512]


def test_a_kohya_dataset_config_keeps_its_subsets(write_toml):
    # the kohya layout is untouched: a dataset with subsets is not one subset
    text = (
        '[[datasets]]\nresolution = 512\n[[datasets.subsets]]\nimage_dir = "a"\n'
        'control_directory = "ca"\n[[datasets.subsets]]\nimage_dir = "b"\n'
    )
    first = _load(write_toml, text).datasets[0]
    assert [s.image_dir for s in first.subsets] == ["a", "b"]
    assert [s.control_directory for s in first.subsets] == ["ca", None]


def test_a_folder_and_a_jsonl_in_one_musubi_dataset_are_refused_naming_both(write_toml):
    text = '[[datasets]]\nimage_directory = "t"\nimage_jsonl_file = "t/pairs.jsonl"\n'
    dataset = write_toml("dataset.toml", text)
    message = error_of(write_toml("run.toml", HEAD + f"dataset_config = {dataset!r}\n"))
    assert "datasets[0] names its images twice, with image_directory and with image_jsonl_file" in (
        message
    )
    assert len(message.strip().splitlines()) == 1


def test_a_musubi_dataset_gets_musubi_tuners_bucketing_and_its_defaults(write_toml):
    # no bucket range: 1536 and Qwen-Image's 1328 load with buckets on
    text = "[general]\nenable_bucket = true\n"
    for side in (1536, 1328):
        text += f'[[datasets]]\nimage_directory = "t{side}"\nresolution = [{side}, {side}]\n'
    text += '[[datasets]]\nimage_directory = "plain"\n'
    big, qwen, plain = _load(write_toml, text).datasets
    assert (big.bucketing, big.resolution, big.bucket_reso_steps) == ("musubi", [1536] * 2, 16)
    assert (qwen.bucketing, qwen.resolution) == ("musubi", [1328, 1328])
    # musubi-tuner's default resolution where none is written
    assert (plain.bucketing, plain.resolution) == ("musubi", [960, 544])


def test_kohyas_bucketing_stays_for_kohya_datasets_and_on_request(write_toml):
    text = '[[datasets]]\nresolution = 512\n[[datasets.subsets]]\nimage_dir = "a"\n'
    (kohya,) = _load(write_toml, text).datasets
    assert (kohya.bucketing, kohya.bucket_reso_steps, kohya.max_bucket_reso) == ("kohya", 64, 1024)
    text = (
        '[general]\nenable_bucket = true\n[[datasets]]\nimage_directory = "t"\n'
        'bucketing = "kohya"\nresolution = [1536, 1536]\n'
    )
    dataset = write_toml("dataset.toml", text)
    path = write_toml("run.toml", HEAD + f"dataset_config = {dataset!r}\n")
    assert "max_bucket_reso = 1024" in error_of(path)  # kohya's range, asked for by name


def test_a_written_bucket_range_is_named_as_unused_by_musubi_bucketing(write_toml):
    text = (
        "[general]\nenable_bucket = true\nmax_bucket_reso = 2048\n"
        '[[datasets]]\nimage_directory = "t"\nbucket_reso_steps = 32\n'
    )
    config = _load(write_toml, text)
    (dataset,) = config.datasets
    assert dataset.bucket_reso_steps == 32  # written: kept
    (notice,) = [n for n in config.notices if "max_bucket_reso" in n]
    assert "general.max_bucket_reso = 2048 is not used by datasets[0]" in notice
    assert 'set bucketing = "kohya"' in notice


def test_a_clip_length_below_one_is_named_by_its_key(write_toml):
    for value in ("[0, 5]", "[]"):
        text = f'[[datasets]]\nvideo_directory = "v"\ntarget_frames = {value}\n'
        path = write_toml("run.toml", HEAD + f"dataset_config = {write_toml('t.toml', text)!r}\n")
        message = error_of(path)
        assert "target_frames" in message and "\n" not in message
