"""musubi-tuner's Krea 2 draw, timestep_sampling krea2_shift: sigmoid(sigmoid_scale * z) shifted
by exp(mu), mu on Krea 2's schedule line (0.5 at 256 image tokens, 1.15 at 6400) at the image's
tokens; refused by name on the other models."""

from __future__ import annotations

import math

import pytest
import torch

from library.config.flow_schema import FlowSection
from library.config.schema import ModelSection
from library.errors import ConfigError
from library.models.families.flux2.family import flux2_family
from library.models.families.krea2.family import krea2_family
from library.models.families.krea2.spec import DRAW, Krea2FlowObjective

_MODEL = ModelSection(pretrained_model_name_or_path="m")


class _Draws:
    def __init__(self, z: torch.Tensor) -> None:
        self.time_normal = z
        self.time_uniform = torch.zeros_like(z)


def _levels(z: torch.Tensor, h: int, w: int, **flow) -> torch.Tensor:
    options = DRAW.options(FlowSection(timestep_sampling="krea2_shift", **flow))
    return Krea2FlowObjective(options, patch=2).levels(_Draws(z), (z.numel(), 16, 1, h, w))


def _musubi_krea2_shift(q: torch.Tensor, h: int, w: int, scale: float) -> torch.Tensor:
    """musubi-tuner's krea2_shift at the normal quantile of ``q`` (its uniform_to_normal_ppF),
    written from its trainer: mu on the line through (256, 0.5) and (6400, 1.15) at
    (h // 2) * (w // 2) tokens, t = sigmoid(scale * z), then t * s / (1 + (s - 1) * t), s =
    exp(mu). Being increasing in z, it is also the draw's inverse CDF."""
    slope = (1.15 - 0.5) / (6400 - 256)
    shift = math.exp(slope * ((h // 2) * (w // 2)) + 0.5 - slope * 256)
    t = torch.sigmoid(scale * math.sqrt(2.0) * torch.erfinv(2 * q.double() - 1))
    return (t * shift / (1 + (shift - 1) * t)).float()


@pytest.mark.parametrize(("h", "w", "scale"), [(128, 128, 1.0), (64, 96, 1.0), (160, 160, 1.5)])
def test_krea2_shift_draws_follow_musubi_tuners_distribution(h, w, scale):
    z = torch.randn(200_000, generator=torch.Generator().manual_seed(0))
    sigmas = _levels(z, h, w, sigmoid_scale=scale)
    q = torch.linspace(0.01, 0.99, 99)
    drawn = torch.quantile(sigmas, q)
    torch.testing.assert_close(drawn, _musubi_krea2_shift(q, h, w, scale), atol=4e-3, rtol=0)


def test_krea2_shift_at_1024_pixels_is_the_schedules():
    """musubi-tuner's anchor: 1024 x 1024 px (128 x 128 latents, 4096 tokens) gives mu
    0.90625, so the median draw is exp(mu) / (1 + exp(mu))."""
    median = _levels(torch.zeros(1), 128, 128)
    shift = math.exp(0.90625)
    torch.testing.assert_close(median, torch.tensor([shift / (1 + shift)]))
    assert _levels(torch.zeros(1), 32, 32) < median < _levels(torch.zeros(1), 160, 160)


def test_krea2_shift_is_taken_on_krea2_and_named_in_the_plan():
    options = DRAW.options(FlowSection(timestep_sampling="krea2_shift"))
    describe = Krea2FlowObjective(options, patch=2).describe()
    assert "timestep_sampling krea2_shift (sigmoid_scale 1)" in describe
    krea2_family().check_options(_MODEL, FlowSection(timestep_sampling="krea2_shift"))


def test_krea2_shift_is_refused_by_name_on_other_models():
    flow = FlowSection(timestep_sampling="krea2_shift")
    with pytest.raises(ConfigError, match="musubi-tuner's draw for Krea 2, not FLUX.2; use one"):
        flux2_family("klein", "4b", False).check_options(_MODEL, flow)
