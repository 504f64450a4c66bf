"""musubi-tuner's bucketing (the datasets of its dataset configs), checked against a separate
computation written from musubi-tuner's BucketSelector as its source describes it: buckets
from the resolution's area (widths from half the square side to the square side), the nearest
aspect ratio compared linearly, bucket_no_upscale keeping small images at their own size."""

from __future__ import annotations

import itertools
import math

import pytest
from data_helpers import write_image

from library.config.loader import load_config
from library.data.buckets import BucketOptions, assign_bucket, bucket_sizes
from library.data.dataset import TrainData
from library.data.plan import plan_lines


def _musubi(resolution, steps=16, no_upscale=False) -> BucketOptions:
    return BucketOptions(
        resolution, True, bucket_reso_steps=steps, bucket_no_upscale=no_upscale, rule="musubi"
    )


def _round_down(value, step):
    return value - value % step


def _expected_buckets(resolution, steps):
    """musubi-tuner's list: float square root, widths in steps, heights rounded down."""
    area = resolution[0] * resolution[1]
    side = int(math.sqrt(area))
    widths = []
    w = _round_down(side // 2, steps)
    while w < side + steps:
        widths.append(w)
        w += steps
    pairs = []
    for w in widths:
        h = _round_down(area // w, steps)
        pairs += [(w, h), (h, w)]
    return sorted(set(pairs))


def _expected_bucket(image, resolution, steps, no_upscale=False):
    """musubi-tuner's choice: own size (rounded down) when not upscaling a small image, else
    the first bucket (in sorted order) of least |bucket w/h - image w/h| in floats."""
    width, height = image
    if no_upscale and width * height <= resolution[0] * resolution[1]:
        return _round_down(width, steps), _round_down(height, steps)
    buckets = _expected_buckets(resolution, steps)
    errors = [abs(w / h - width / height) for w, h in buckets]
    return buckets[errors.index(min(errors))]


RESOLUTIONS = [(512, 512), (720, 720), (960, 544), (1024, 1024), (1328, 1328), (1536, 1536)]


@pytest.mark.parametrize("resolution", RESOLUTIONS)
@pytest.mark.parametrize("steps", [16, 32, 64])
def test_bucket_lists_match_musubi_tuners(resolution, steps):
    assert bucket_sizes(_musubi(resolution, steps)) == _expected_buckets(resolution, steps)


IMAGES = [(720, 720), (1920, 1080), (1080, 1920), (3000, 2000), (300, 200), (640, 480),
          (100, 1000), (5000, 700), (1328, 1328), (997, 1013)]  # fmt: skip


@pytest.mark.parametrize("resolution", RESOLUTIONS)
@pytest.mark.parametrize("no_upscale", [False, True])
def test_assignment_matches_musubi_tuners(resolution, no_upscale):
    options = _musubi(resolution, no_upscale=no_upscale)
    for image in IMAGES:
        expected = _expected_bucket(image, resolution, 16, no_upscale)
        assert assign_bucket(image, options) == expected, image


def test_square_720_stays_720_where_kohyas_rule_makes_704():
    square = (720, 720)
    assert assign_bucket(square, _musubi(square)) == (720, 720)
    kohya = BucketOptions(square, True, min_bucket_reso=256, max_bucket_reso=1024)
    assert assign_bucket(square, kohya) == (704, 704)


def test_buckets_above_1024_need_no_bucket_range():
    # 1328 * 1328 = 1763584; the narrowest width is 1328 // 2 = 664 -> 656 on the 16 grid, whose
    # height is 1763584 // 656 = 2688 (a multiple of 16): taller than any kohya default allows
    sizes = bucket_sizes(_musubi((1328, 1328)))
    assert sizes[0] == (656, 2688) and sizes[-1] == (2688, 656)
    assert (1328, 1328) in sizes


def test_no_upscale_keeps_small_images_and_refuses_ones_under_a_step():
    options = _musubi((512, 512), no_upscale=True)
    assert assign_bucket((300, 200), options) == (288, 192)
    with pytest.raises(ValueError, match="smaller than bucket_reso_steps = 16"):
        assign_bucket((8, 300), options)


def test_every_bucket_fits_the_area_and_the_grid():
    for resolution, steps in itertools.product(RESOLUTIONS, (16, 64)):
        area = resolution[0] * resolution[1]
        for w, h in bucket_sizes(_musubi(resolution, steps)):
            assert w * h <= area and w % steps == 0 and h % steps == 0


def test_a_musubi_dataset_config_trains_square_720_images_at_720(tmp_path):
    image_dir = tmp_path / "img"
    write_image(image_dir / "a.png", size=(720, 720))
    write_image(image_dir / "b.png", size=(1280, 720))
    dataset = tmp_path / "dataset.toml"
    dataset.write_text(
        "[general]\nresolution = [720, 720]\nenable_bucket = true\n"
        f"[[datasets]]\nimage_directory = {str(image_dir)!r}\n"
    )
    run = tmp_path / "run.toml"
    run.write_text(f'pretrained_model_name_or_path = "m"\ndataset_config = {str(dataset)!r}\n')
    data = TrainData(load_config(str(run)).datasets, seed=0)
    assert any("buckets (musubi-tuner's rule;" in line for line in plan_lines(data))
    buckets = {image.item.path.name: image.bucket for image in data.scanned[0].images}
    assert buckets == {
        "a.png": (720, 720),
        "b.png": _expected_bucket((1280, 720), (720, 720), 16),
    }
