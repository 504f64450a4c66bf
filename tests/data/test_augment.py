from __future__ import annotations

import colorsys
import random

import pytest
import torch

from library.data.augment import AugmentDraws, AugmentOptions, draw_augment, shift_hue
from library.data.schedule import stable_seed

ALL = AugmentOptions(flip_aug=True, random_crop=True, color_aug=True)


def test_no_options_draw_nothing():
    draws = draw_augment(AugmentOptions(), seed=1, epoch=0, position=5)
    assert draws == AugmentDraws(flip=False, crop_fraction=None, hue_shift=0.0)


def test_draws_follow_the_documented_keys():
    # Each option's stream is random.Random(stable_seed(seed, "augment", epoch, position, name)).
    def stream(position, name):
        return random.Random(stable_seed(7, "augment", 3, position, name))

    for position in range(64):
        draws = draw_augment(ALL, seed=7, epoch=3, position=position)
        crop = stream(position, "random_crop")
        assert draws.flip == (stream(position, "flip_aug").random() < 0.5)
        assert draws.crop_fraction == (crop.random(), crop.random())
        assert draws.hue_shift == stream(position, "color_aug").uniform(-8 / 360, 8 / 360)


def test_one_option_never_changes_another():
    for position in range(50):
        both = draw_augment(ALL, seed=2, epoch=1, position=position)
        flip = draw_augment(AugmentOptions(flip_aug=True), seed=2, epoch=1, position=position)
        crop = draw_augment(AugmentOptions(random_crop=True), seed=2, epoch=1, position=position)
        color = draw_augment(AugmentOptions(color_aug=True), seed=2, epoch=1, position=position)
        assert both == AugmentDraws(flip.flip, crop.crop_fraction, color.hue_shift)


def test_draws_are_repeatable_and_vary_with_every_key_part():
    key = {"seed": 3, "epoch": 2, "position": 9}
    first = [draw_augment(ALL, **key) for _ in range(3)]
    assert first[0] == first[1] == first[2]
    for part in key:
        changed = {**key, part: key[part] + 1}
        assert draw_augment(ALL, **changed).crop_fraction != first[0].crop_fraction


def test_draw_distributions():
    draws = [draw_augment(ALL, seed=0, epoch=0, position=p) for p in range(2000)]
    flips = sum(d.flip for d in draws) / len(draws)
    assert 0.45 < flips < 0.55
    shifts = [d.hue_shift for d in draws]
    assert all(-8 / 360 <= s <= 8 / 360 for s in shifts)
    assert min(shifts) < -7 / 360 and max(shifts) > 7 / 360
    xs = [d.crop_fraction[0] for d in draws] + [d.crop_fraction[1] for d in draws]
    assert all(0 <= x < 1 for x in xs)
    assert 0.45 < sum(xs) / len(xs) < 0.55


def _colorsys_shift(rgb: torch.Tensor, shift: float) -> torch.Tensor:
    out = torch.empty_like(rgb)
    for y in range(rgb.shape[1]):
        for x in range(rgb.shape[2]):
            h, s, v = colorsys.rgb_to_hsv(*rgb[:, y, x].tolist())
            out[:, y, x] = torch.tensor(colorsys.hsv_to_rgb((h + shift) % 1.0, s, v))
    return out


@pytest.mark.parametrize("shift", [8 / 360, -8 / 360, 0.3, -0.77])
def test_shift_hue_matches_colorsys(shift):
    rgb = torch.rand(3, 6, 7, generator=torch.Generator().manual_seed(0))
    rgb[:, 0, 0] = torch.tensor([1.0, 1.0, 0.0])  # ties between channels: hue exactly 1/6
    rgb[:, 0, 1] = torch.tensor([0.2, 0.5, 0.5])
    torch.testing.assert_close(
        shift_hue(rgb, shift), _colorsys_shift(rgb, shift), atol=1e-5, rtol=0
    )
    # Hue does not depend on the value scale.
    torch.testing.assert_close(
        shift_hue(rgb * 255, shift), shift_hue(rgb, shift) * 255, atol=1e-3, rtol=1e-5
    )


def test_shift_hue_keeps_greys_exactly_and_zero_is_identity():
    grey = torch.tensor([0.0, 0.25, 0.5, 1.0]).view(1, 1, 4).expand(3, 2, 4).clone()
    assert torch.equal(shift_hue(grey, 0.02), grey)
    rgb = torch.rand(3, 4, 4)
    assert shift_hue(rgb, 0.0) is rgb
