"""musubi-tuner's frame extraction: the clips cut from a video's frame count, checked against the
diagrams of musubi-tuner's dataset documentation (x = a frame in the clip), and its frame-rate
resampling against a count of the frames each output frame receives."""

from __future__ import annotations

import math

import pytest

from library.data.frame_extraction import (
    Window,
    extract_windows,
    frames_needed,
    resample_indices,
    resample_times,
    round_target_frames,
)
from library.errors import ConfigError


def _windows(diagram: str) -> list[Window]:
    rows = [row.strip() for row in diagram.strip().splitlines()]
    return [Window(row.index("x"), row.count("x")) for row in rows]


HEAD_1_13_25 = """
xooooooooooooooooooooooooooooooooooooooo
xxxxxxxxxxxxxooooooooooooooooooooooooooo
xxxxxxxxxxxxxxxxxxxxxxxxxooooooooooooooo
"""
CHUNK_13_25 = """
xxxxxxxxxxxxxooooooooooooooooooooooooooo
oooooooooooooxxxxxxxxxxxxxoooooooooooooo
ooooooooooooooooooooooooooxxxxxxxxxxxxxo
xxxxxxxxxxxxxxxxxxxxxxxxxooooooooooooooo
"""
SLIDE_1_13_25_STRIDE_10 = """
xooooooooooooooooooooooooooooooooooooooo
ooooooooooxooooooooooooooooooooooooooooo
ooooooooooooooooooooxooooooooooooooooooo
ooooooooooooooooooooooooooooooxooooooooo
xxxxxxxxxxxxxooooooooooooooooooooooooooo
ooooooooooxxxxxxxxxxxxxooooooooooooooooo
ooooooooooooooooooooxxxxxxxxxxxxxooooooo
xxxxxxxxxxxxxxxxxxxxxxxxxooooooooooooooo
ooooooooooxxxxxxxxxxxxxxxxxxxxxxxxxooooo
"""
# The documentation draws the one-frame clips' middle starts at 13 and 25; the starts are
# spread evenly over 0 .. 39 and truncated (39 * 2 / 3 = 26), as musubi-tuner's code cuts them.
UNIFORM_1_13_25_SAMPLE_4 = """
xooooooooooooooooooooooooooooooooooooooo
oooooooooooooxoooooooooooooooooooooooooo
ooooooooooooooooooooooooooxooooooooooooo
ooooooooooooooooooooooooooooooooooooooox
xxxxxxxxxxxxxooooooooooooooooooooooooooo
oooooooooxxxxxxxxxxxxxoooooooooooooooooo
ooooooooooooooooooxxxxxxxxxxxxxooooooooo
oooooooooooooooooooooooooooxxxxxxxxxxxxx
xxxxxxxxxxxxxxxxxxxxxxxxxooooooooooooooo
oooooxxxxxxxxxxxxxxxxxxxxxxxxxoooooooooo
ooooooooooxxxxxxxxxxxxxxxxxxxxxxxxxooooo
oooooooooooooooxxxxxxxxxxxxxxxxxxxxxxxxx
"""


@pytest.mark.parametrize(
    ("extraction", "targets", "options", "diagram"),
    [
        ("head", [1, 13, 25], {}, HEAD_1_13_25),
        ("chunk", [13, 25], {}, CHUNK_13_25),
        ("slide", [1, 13, 25], {"frame_stride": 10}, SLIDE_1_13_25_STRIDE_10),
        ("uniform", [1, 13, 25], {"frame_sample": 4}, UNIFORM_1_13_25_SAMPLE_4),
    ],
)
def test_clips_of_a_40_frame_video_are_musubi_tuners(extraction, targets, options, diagram):
    assert extract_windows(40, targets, extraction, **options) == _windows(diagram)


def test_full_cuts_to_max_frames_and_rounds_down_to_four_n_plus_one():
    # musubi-tuner's documentation: videos of 20, 25, 35 frames with max_frames = 31. It draws
    # the third cut to 31, which is not 4N + 1; its code rounds 31 down to 29, as here
    cut = [extract_windows(n, [1], "full", max_frames=31) for n in (20, 25, 35)]
    assert cut == [[Window(0, 17)], [Window(0, 25)], [Window(0, 29)]]


def test_uniform_with_one_sample_is_head():
    assert extract_windows(40, [5, 9], "uniform", frame_sample=1) == extract_windows(
        40, [5, 9], "head"
    )


def test_a_video_shorter_than_a_length_gets_no_clip_of_it():
    assert extract_windows(10, [5, 13], "head") == [Window(0, 5)]
    assert extract_windows(10, [13], "slide") == []
    assert extract_windows(0, [1], "full") == []


def test_target_frames_round_down_to_four_n_plus_one_without_duplicates():
    assert round_target_frames([30, 25, 1, 27, 4]) == (1, 25, 29)
    assert all((t - 1) % 4 == 0 for t in round_target_frames(range(1, 100)))
    assert extract_windows(40, [16], "head") == [Window(0, 13)]


def test_head_needs_only_the_longest_clip():
    assert frames_needed([1, 13, 27], "head") == 25
    assert frames_needed([1, 13], "slide") is None


@pytest.mark.parametrize(
    ("key", "kwargs"),
    [
        ("frame_extraction", {"frame_extraction": "middle"}),
        ("frame_stride", {"frame_extraction": "slide", "frame_stride": 0}),
        ("frame_sample", {"frame_extraction": "uniform", "frame_sample": 0}),
        ("max_frames", {"frame_extraction": "full", "max_frames": 0}),
        ("target_frames", {"target_frames": []}),
        ("target_frames", {"target_frames": [0, 5]}),
    ],
)
def test_settings_musubi_tuner_would_not_take_are_named(key, kwargs):
    with pytest.raises(ConfigError) as caught:
        extract_windows(40, **{"target_frames": [5], **kwargs})
    assert caught.value.problems[0].key == key
    assert key in str(caught.value) and "\n" not in str(caught.value)


@pytest.mark.parametrize(("source", "target"), [(30.0, 16.0), (24.0, 16.0), (60.0, 16.0)])
def test_resampling_keeps_one_frame_per_output_frame(source, target):
    count = 97
    kept = resample_indices(count, source, target)
    # independent: the output frame of source frame i is floor(i * target / source); each output
    # frame takes the first source frame landing on it (with a tolerance where i * target /
    # source is a whole number, which a running sum may land just below)
    for position, index in enumerate(kept):
        assert math.floor(index * target / source + 1e-9) in (position, position - 1)
    assert len(kept) in (
        math.floor((count - 1) * target / source) + 1,
        math.floor((count - 1) * target / source),
    )
    assert kept == sorted(set(kept)) and kept[0] == 0


def test_resampling_30_to_16_drops_the_frames_musubi_tuner_drops():
    # musubi-tuner adds the step 16 / 30 frame by frame; after 15 additions the sum is
    # 7.999999999999999, so frame 15 lands on output frame 7 and is dropped, where
    # floor(15 * 16 / 30) = 8 would keep it
    assert resample_indices(16, 30.0, 16.0) == [0, 2, 4, 6, 8, 10, 12, 14]


def test_without_source_fps_every_frame_is_kept_and_a_slow_video_is_not_padded():
    assert resample_indices(5, None, 16.0) == [0, 1, 2, 3, 4]
    assert resample_indices(5, 8.0, 16.0) == [0, 1, 2, 3, 4]


def test_variable_frame_rate_is_placed_by_timestamps():
    times = [0.0, 0.1, 0.15, 0.2, 0.5, 0.55, 0.6, 0.9, 1.0]
    # at 10 fps: output frames 0, 1, 1, 2, 5, 5, 6, 9, 10 -> the first of each
    assert resample_times(times, 10.0) == [0, 1, 3, 4, 6, 7, 8]
