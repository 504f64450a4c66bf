from __future__ import annotations

import pytest

from library.data.buckets import BucketOptions, assign_bucket, bucket_sizes


def _on(resolution=(512, 512), **kwargs) -> BucketOptions:
    return BucketOptions(resolution=resolution, enable_bucket=True, **kwargs)


# Worked out by hand for area 512 * 512 = 262144, steps 64, sides 256..1024: for each width w the
# height is the largest multiple of 64 <= min(1024, 262144 / w), e.g. w = 320: 819.2 -> 768,
# w = 704: 372.4 -> 320, w = 832: 315.1 -> 256; then both orientations.
BUCKETS_512 = [
    (256, 832), (256, 896), (256, 960), (256, 1024),
    (320, 704), (320, 768),
    (384, 640),
    (448, 576),
    (512, 512),
    (576, 448),
    (640, 384),
    (704, 320), (768, 320),
    (832, 256), (896, 256), (960, 256), (1024, 256),
]  # fmt: skip


def test_buckets_for_512_by_64_are_the_hand_computed_list():
    assert bucket_sizes(_on()) == BUCKETS_512


@pytest.mark.parametrize(
    "options",
    [
        _on(),
        _on((768, 512)),
        _on((1024, 1024), min_bucket_reso=512, max_bucket_reso=2048, bucket_reso_steps=32),
        _on((640, 448), min_bucket_reso=192, max_bucket_reso=768, bucket_reso_steps=64),
        _on((576, 576), min_bucket_reso=320, max_bucket_reso=640, bucket_reso_steps=64),
    ],
)
def test_bucket_list_properties(options):
    sizes = bucket_sizes(options)
    steps, area = options.bucket_reso_steps, options.resolution[0] * options.resolution[1]
    assert sizes == sorted(set(sizes))  # sorted, no duplicates
    for w, h in sizes:
        assert w * h <= area
        assert w % steps == 0 and h % steps == 0
        assert options.min_bucket_reso <= w <= options.max_bucket_reso
        assert options.min_bucket_reso <= h <= options.max_bucket_reso
        assert (h, w) in sizes
    # The resolution itself (on the grid here) is a bucket.
    assert tuple(options.resolution) in sizes


def test_without_bucketing_every_image_gets_the_resolution():
    options = BucketOptions(resolution=(768, 512), bucket_no_upscale=True)
    assert bucket_sizes(options) == [(768, 512)]
    for size in [(100, 100), (4000, 300), (300, 4000)]:
        assert assign_bucket(size, options) == (768, 512)


@pytest.mark.parametrize(
    ("image", "bucket"),
    [
        ((1000, 1000), (512, 512)),  # 1:1
        ((600, 900), (384, 640)),  # 2:3 = 0.667: 384/640 = 0.6 beats 448/576 = 0.778 in log
        ((900, 600), (640, 384)),  # 3:2
        ((900, 1600), (384, 640)),  # 9:16 = 0.5625: 0.6 beats 320/704 = 0.4545
        ((1600, 900), (640, 384)),  # 16:9
        ((300, 900), (256, 832)),  # 1:3 = 0.333: 256/832 = 0.308 beats 320/768 = 0.417
        ((900, 300), (832, 256)),  # 3:1
    ],
)
def test_mixed_aspects_land_in_the_nearest_bucket(image, bucket):
    assert assign_bucket(image, _on()) == bucket
    assert assign_bucket(image, _on(), BUCKETS_512) == bucket


def test_ties_go_to_the_larger_area_then_the_smaller_width():
    assert assign_bucket((10, 10), _on(), [(64, 64), (128, 128)]) == (128, 128)
    # 1:2 and 2:1 are equally far from 1:1 in log space.
    assert assign_bucket((10, 10), _on(), [(128, 64), (64, 128)]) == (64, 128)


@pytest.mark.parametrize(
    ("image", "bucket"),
    [
        ((300, 200), (256, 192)),  # small: own size rounded down (256/192 beats 192/192, 256/128)
        ((64, 64), (64, 64)),
        ((1000, 1000), (512, 512)),  # scaled by 0.512 to 512 x 512
        # 127 x 1000 rounds to 64 x 960 (0.067 vs 0.127); 64 x 896 (0.071) is nearer.
        ((127, 1000), (64, 896)),
        # scaled by sqrt(262144 / 2097152) to 724.1 x 362.0 -> 704 x 320; 640 x 320 is exactly 2:1.
        ((2048, 1024), (640, 320)),
    ],
)
def test_no_upscale_buckets_by_hand(image, bucket):
    assert assign_bucket(image, _on(bucket_no_upscale=True)) == bucket


def test_no_upscale_clamps_the_long_side_to_max_bucket_reso():
    options = _on((1024, 1024), bucket_no_upscale=True)
    # Area alone would allow 2896 x 362; the long side is clamped to 1024 (scale 0.256) first.
    assert assign_bucket((4000, 500), options) == (1024, 128)


def test_no_upscale_never_enlarges_and_stays_in_bounds():
    options = _on(bucket_no_upscale=True)
    for width in range(64, 3000, 97):
        for height in range(64, 3000, 89):
            # A long side over 1024 is scaled down first; a short side under 64 then is an error.
            if min(width, height) * 1024 / max(width, height, 1024) < 64:
                with pytest.raises(ValueError, match="smaller than bucket_reso_steps"):
                    assign_bucket((width, height), options)
                continue
            w, h = assign_bucket((width, height), options)
            assert w <= width and h <= height
            assert w % 64 == 0 and h % 64 == 0 and w >= 64 and h >= 64
            assert w * h <= 512 * 512 and max(w, h) <= 1024


def test_no_upscale_too_small_image_is_an_error():
    with pytest.raises(ValueError, match="40x300 is smaller than bucket_reso_steps"):
        assign_bucket((40, 300), _on(bucket_no_upscale=True))


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (_on(bucket_reso_steps=60), "bucket_reso_steps = 60 must be a positive multiple of 8"),
        (_on(bucket_reso_steps=0), "bucket_reso_steps = 0 must be a positive multiple of 8"),
        (_on(min_bucket_reso=300), "min_bucket_reso = 300 must be a positive multiple"),
        (_on(max_bucket_reso=1000), "max_bucket_reso = 1000 must be a positive multiple"),
        (_on(min_bucket_reso=0), "min_bucket_reso = 0 must be a positive multiple"),
        (
            _on(min_bucket_reso=1024, max_bucket_reso=512),
            "min_bucket_reso = 1024 is larger than max_bucket_reso = 512",
        ),
        (_on((1280, 512)), r"resolution width 1280 is outside .* \[256, 1024\]"),
        (_on((512, 128)), "resolution height 128 is outside"),
    ],
)
def test_check_errors(options, message):
    with pytest.raises(ValueError, match=message):
        options.check()
    with pytest.raises(ValueError, match=message):
        bucket_sizes(options)


def test_resolution_range_is_only_checked_with_buckets():
    BucketOptions(resolution=(1280, 512)).check()  # no error: buckets are off
    with pytest.raises(ValueError, match="resolution width 1280"):
        BucketOptions(resolution=(1280, 512), enable_bucket=True).check()
