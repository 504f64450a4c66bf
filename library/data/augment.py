"""Image augmentation: keyed random draws per sample, and the hue rotation of color_aug.

Every draw comes from its own stream keyed by (seed, epoch, position, option name), so a sample's
augmentation is the same whatever the number of processes, the micro-batch split or the data
loader workers, and turning one option on never changes the draws of another.

- flip_aug: a horizontal flip with probability 1/2.
- random_crop: where the crop sits inside the covering resize, as a fraction of the slack along
  x and y (uniform); without it the crop is centered.
- color_aug: a rotation of every pixel's hue by a shift uniform in [-8/360, 8/360] turns, i.e.
  up to 8 degrees around the colour circle. Saturation and value stay as they are, so greys are
  untouched. (kohya's color_aug is likewise a small random hue shift.)
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import torch

from library.data.schedule import stable_seed

MAX_HUE_SHIFT = 8 / 360  # turns


@dataclass(frozen=True)
class AugmentOptions:
    """Which augmentations a subset uses (kohya's key names)."""

    flip_aug: bool = False
    random_crop: bool = False
    color_aug: bool = False


@dataclass(frozen=True)
class AugmentDraws:
    """One sample's augmentation: flip horizontally or not; the crop's (x, y) position as a
    fraction in [0, 1] of the slack (None = center); the hue shift in turns (0 = none)."""

    flip: bool
    crop_fraction: tuple[float, float] | None
    hue_shift: float


def _stream(seed: int, epoch: int, position: int, option: str) -> random.Random:
    return random.Random(stable_seed(seed, "augment", epoch, position, option))


def draw_augment(options: AugmentOptions, seed: int, epoch: int, position: int) -> AugmentDraws:
    """The augmentation of the sample at `position` of `epoch`; the same for the same key."""
    flip = False
    if options.flip_aug:
        flip = _stream(seed, epoch, position, "flip_aug").random() < 0.5
    crop_fraction = None
    if options.random_crop:
        rng = _stream(seed, epoch, position, "random_crop")
        crop_fraction = (rng.random(), rng.random())
    hue_shift = 0.0
    if options.color_aug:
        hue_shift = _stream(seed, epoch, position, "color_aug").uniform(
            -MAX_HUE_SHIFT, MAX_HUE_SHIFT
        )
    return AugmentDraws(flip=flip, crop_fraction=crop_fraction, hue_shift=hue_shift)


def shift_hue(rgb: torch.Tensor, shift: float) -> torch.Tensor:
    """`rgb` ([3, H, W], float, non-negative) with every pixel's HSV hue rotated by `shift` turns.

    Saturation and value are kept, and so is the value scale (hue does not depend on it: [0, 1]
    and [0, 255] both work). Grey pixels (no chroma) come back exactly. A zero shift returns
    `rgb` itself.
    """
    if shift == 0:
        return rgb
    red, green, blue = rgb.unbind(0)
    value, argmax = rgb.max(dim=0)
    chroma = value - rgb.min(dim=0).values
    safe = torch.where(chroma > 0, chroma, torch.ones_like(chroma))
    # Hue in sixths of a turn, from the channel that holds the maximum.
    hue = torch.where(
        argmax == 0,
        ((green - blue) / safe) % 6,
        torch.where(argmax == 1, (blue - red) / safe + 2, (red - green) / safe + 4),
    )
    hue = (hue + 6 * shift) % 6
    # HSV -> RGB: channel n (R=5, G=3, B=1) = V - C * clamp(min(k, 4 - k), 0, 1), k = (n + H) % 6.
    channels = []
    for n in (5, 3, 1):
        k = (n + hue) % 6
        channels.append(value - chroma * torch.minimum(k, 4 - k).clamp(0, 1))
    return torch.stack(channels)
