"""Aspect-ratio buckets: the training size (width, height) of each image.

Without buckets every image is trained at the dataset's resolution (covered and cropped). With
buckets an image is trained at a size close to its own aspect ratio, so little of it is cropped:

- Predefined buckets (kohya's scheme): for each width from min_bucket_reso to max_bucket_reso in
  bucket_reso_steps, the tallest height on the step grid that keeps the area within the
  resolution's area and the side within max_bucket_reso; both orientations, plus the square of the
  largest grid side within that area. An image goes to the bucket of nearest aspect ratio.
- bucket_no_upscale: each image gets a bucket of its own, its size shrunk to the resolution's area
  (if larger) and rounded down to the step grid, so no image is ever enlarged.

Aspect ratios are compared in log space, so 2:1 and 1:2 are equally far from 1:1. The comparison
is done on exact fractions, which makes ties (and hence the choice) independent of float rounding.

musubi-tuner's rule (``rule = "musubi"``; the datasets of its dataset configs), as its
BucketSelector computes it:

- Bucket sizes: s = floor(sqrt(area of the resolution)); for each width w from (s // 2) rounded
  down to the step up to s (inclusive, in steps), the height (area // w) rounded down to the
  step; both orientations. No bucket range: min_bucket_reso and max_bucket_reso are not read,
  and a bucket side may exceed the resolution's (up to about twice its square side).
- Assignment: the bucket whose width / height is nearest the image's, compared linearly (not in
  log space); a tie goes to the first in (width, height) order.
- bucket_no_upscale: an image whose area is within the resolution's keeps its own size, each side
  rounded down to the step; a larger image goes to its nearest bucket as above (it is not
  shrunk at its own aspect ratio as with kohya's rule).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction

# Tolerance in units of one step when rounding scaled sides down: a side that is a whole number of
# steps up to float error must not lose a step.
_FLOOR_EPSILON = 1e-6

KOHYA, MUSUBI = "kohya", "musubi"  # the bucketing rules (module docstring)


@dataclass(frozen=True)
class BucketOptions:
    """A dataset's bucket settings (kohya's key names). `resolution` is (width, height); its area
    is the largest bucket area."""

    resolution: tuple[int, int]
    enable_bucket: bool = False
    min_bucket_reso: int = 256
    max_bucket_reso: int = 1024
    bucket_reso_steps: int = 64
    bucket_no_upscale: bool = False
    rule: str = "kohya"  # "kohya" or "musubi" (module docstring)

    @property
    def max_area(self) -> int:
        """The resolution's area: no bucket is larger."""
        return self.resolution[0] * self.resolution[1]

    def check(self) -> None:
        """Raise ValueError (one line naming the key and the fix) if the settings are unusable."""
        steps, low, high = self.bucket_reso_steps, self.min_bucket_reso, self.max_bucket_reso
        if steps <= 0 or steps % 8:
            raise ValueError(
                f"bucket_reso_steps = {steps} must be a positive multiple of 8 (the VAE "
                "downsamples by 8); use 64 or another multiple of 8"
            )
        if self.rule == MUSUBI:
            return  # no bucket range
        for key, value in (("min_bucket_reso", low), ("max_bucket_reso", high)):
            if value <= 0 or value % steps:
                lower = max(steps, value // steps * steps)
                raise ValueError(
                    f"{key} = {value} must be a positive multiple of bucket_reso_steps = {steps}; "
                    f"use {lower} or {lower + steps}"
                )
        if low > high:
            raise ValueError(
                f"min_bucket_reso = {low} is larger than max_bucket_reso = {high}; "
                "lower min_bucket_reso or raise max_bucket_reso"
            )
        if not self.enable_bucket:
            return
        for side, value in zip(("width", "height"), self.resolution, strict=True):
            if not low <= value <= high:
                raise ValueError(
                    f"resolution {side} {value} is outside [min_bucket_reso, max_bucket_reso] = "
                    f"[{low}, {high}]; change resolution or the bucket range to include it"
                )


def bucket_sizes(options: BucketOptions) -> list[tuple[int, int]]:
    """The predefined buckets as sorted, unique (width, height) pairs.

    Without enable_bucket: just the resolution. With bucket_no_upscale images get buckets of their
    own (see assign_bucket) and this list is not used. Raises ValueError for unusable options.
    """
    options.check()
    if not options.enable_bucket:
        return [tuple(options.resolution)]
    if options.rule == MUSUBI:
        return _musubi_sizes(options)
    steps, area = options.bucket_reso_steps, options.max_area
    square = math.isqrt(area) // steps * steps
    sizes = {(square, square)}
    for width in range(options.min_bucket_reso, options.max_bucket_reso + 1, steps):
        height = min(options.max_bucket_reso, area // width // steps * steps)
        if height >= options.min_bucket_reso:
            sizes.add((width, height))
            sizes.add((height, width))
    return sorted(sizes)


def predefined_buckets(options: BucketOptions) -> bool:
    """Whether images go to predefined buckets (bucket_sizes), not only to sizes of their own:
    with buckets on, unless kohya's bucket_no_upscale (musubi-tuner's still uses its buckets
    for images larger than the resolution's area)."""
    return options.enable_bucket and (options.rule == MUSUBI or not options.bucket_no_upscale)


def _musubi_sizes(options: BucketOptions) -> list[tuple[int, int]]:
    steps, area = options.bucket_reso_steps, options.max_area
    side = math.isqrt(area)
    first = side // 2 // steps * steps
    sizes = set()
    for width in range(first, side + steps, steps):
        height = area // width // steps * steps
        sizes.add((width, height))
        sizes.add((height, width))
    return sorted(sizes)


def _musubi_bucket(
    image_size: tuple[int, int], options: BucketOptions, sizes: Sequence[tuple[int, int]] | None
) -> tuple[int, int]:
    width, height = image_size
    steps = options.bucket_reso_steps
    if options.bucket_no_upscale and width * height <= options.max_area:
        own = (width // steps * steps, height // steps * steps)
        if min(own) < steps:
            raise ValueError(
                f"image {width}x{height} is smaller than bucket_reso_steps = {steps} on a side; "
                "remove it or unset bucket_no_upscale"
            )
        return own
    if sizes is None:
        sizes = bucket_sizes(options)
    aspect = Fraction(width, height)
    return min(sizes, key=lambda s: (abs(Fraction(s[0], s[1]) - aspect), s))


def _aspect_error(image_size: tuple[int, int], bucket: tuple[int, int]) -> Fraction:
    """exp(|log(w/h) - log(bw/bh)|) as an exact fraction (monotonic in the log-space error)."""
    (width, height), (bucket_w, bucket_h) = image_size, bucket
    a, b = width * bucket_h, height * bucket_w
    return Fraction(max(a, b), min(a, b))


def _nearest(image_size: tuple[int, int], sizes: Sequence[tuple[int, int]]) -> tuple[int, int]:
    """The size of nearest aspect ratio; ties go to the larger area, then the smaller width."""
    return min(sizes, key=lambda s: (_aspect_error(image_size, s), -s[0] * s[1], s[0]))


def _no_upscale_bucket(image_size: tuple[int, int], options: BucketOptions) -> tuple[int, int]:
    width, height = image_size
    steps = options.bucket_reso_steps
    scale = min(
        1.0,
        options.max_bucket_reso / max(width, height),
        math.sqrt(options.max_area / (width * height)),
    )
    floor_w, floor_h = (
        int(side * scale / steps + _FLOOR_EPSILON) * steps for side in (width, height)
    )
    if floor_w < steps or floor_h < steps:
        raise ValueError(
            f"image {width}x{height} is smaller than bucket_reso_steps = {steps} on a side "
            f"(after fitting it to the resolution's area); remove it or lower bucket_reso_steps"
        )
    candidates = [(floor_w, floor_h), (floor_w - steps, floor_h), (floor_w, floor_h - steps)]
    return _nearest(image_size, [(w, h) for w, h in candidates if w >= steps and h >= steps])


def assign_bucket(
    image_size: tuple[int, int],
    options: BucketOptions,
    sizes: Sequence[tuple[int, int]] | None = None,
) -> tuple[int, int]:
    """The (width, height) an image of `image_size` (width, height, as displayed) is trained at.

    - enable_bucket off: the resolution.
    - bucket_no_upscale: the image's own size, first shrunk (keeping its aspect ratio) so its long
      side is at most max_bucket_reso and its area at most the resolution's, then rounded down to
      multiples of bucket_reso_steps; of that size and the ones one step smaller on one side, the
      one nearest in aspect ratio. Never larger than the image on either side. ValueError if a
      side would be under one step.
    - otherwise: the bucket of `sizes` (default bucket_sizes(options)) nearest in aspect ratio in
      log space; ties go to the larger area, then the smaller width.

    With ``rule = "musubi"``, musubi-tuner's assignment instead (module docstring).
    """
    width, height = image_size
    if width <= 0 or height <= 0:
        raise ValueError(f"image size {width}x{height} must be positive")
    if not options.enable_bucket:
        return tuple(options.resolution)
    if options.rule == MUSUBI:
        return _musubi_bucket((width, height), options, sizes)
    if options.bucket_no_upscale:
        options.check()
        return _no_upscale_bucket((width, height), options)
    if sizes is None:
        sizes = bucket_sizes(options)
    if not sizes:
        raise ValueError("no bucket sizes to choose from")
    return _nearest((width, height), sizes)
