"""musubi-tuner's FLUX.2 draw, timestep_sampling flux2_shift, is taken on FLUX.2 as the draw it
is there (flux_shift on FLUX.2's own tokens), and refused by name on the other models."""

from __future__ import annotations

import math

import pytest
import torch

from library.config.flow_schema import FlowSection
from library.config.schema import ModelSection
from library.errors import ConfigError
from library.models.families.flux.family import flux_family
from library.models.families.flux2.family import flux2_family
from library.models.families.flux2.spec import DRAW, Flux2FlowObjective
from library.models.families.krea2.family import krea2_family

_MODEL = ModelSection(pretrained_model_name_or_path="m")


class _Draws:
    def __init__(self, z: torch.Tensor) -> None:
        self.time_normal = z
        self.time_uniform = torch.rand(z.shape, generator=torch.Generator().manual_seed(1))


def _levels(sampling: str, z: torch.Tensor, shape, **flow) -> torch.Tensor:
    options = DRAW.options(FlowSection(timestep_sampling=sampling, **flow))
    return Flux2FlowObjective(options, patch=1).levels(_Draws(z), shape)


def _musubi_flux2_shift(z: torch.Tensor, h: int, w: int, scale: float) -> torch.Tensor:
    """musubi-tuner's flux2_shift, written from its trainer: mu on the line through (256, 0.5)
    and (4096, 1.15) at h * w of the (already patched) FLUX.2 latent, t = sigmoid(scale * z)
    shifted by exp(mu) as t * s / (1 + (s - 1) * t)."""
    slope = (1.15 - 0.5) / (4096 - 256)
    shift = math.exp(slope * (h * w) + (0.5 - slope * 256))
    t = torch.sigmoid(scale * z)
    return t * shift / (1 + (shift - 1) * t)


@pytest.mark.parametrize(("h", "w", "scale"), [(64, 64, 1.0), (48, 80, 1.0), (96, 128, 1.7)])
def test_flux2_shift_draws_what_flux_shift_draws_and_musubi_tuner_does(h, w, scale):
    z = torch.randn(4096, generator=torch.Generator().manual_seed(0))
    shape = (z.numel(), 128, h, w)
    drawn = _levels("flux2_shift", z, shape, sigmoid_scale=scale)
    torch.testing.assert_close(drawn, _levels("flux_shift", z, shape, sigmoid_scale=scale))
    torch.testing.assert_close(drawn, _musubi_flux2_shift(z, h, w, scale))


def test_flux2_shift_is_a_config_value_named_in_the_plan():
    options = DRAW.options(FlowSection(timestep_sampling="flux2_shift"))
    objective = Flux2FlowObjective(options, patch=1)
    assert "timestep_sampling flux2_shift (sigmoid_scale 1)" in objective.describe()
    flux2_family("klein", "4b", False).check_options(
        _MODEL, FlowSection(timestep_sampling="flux2_shift")
    )


@pytest.mark.parametrize(
    ("family", "label"),
    [(lambda flow: flux_family("dev", flow), "Flux.1"), (lambda flow: krea2_family(), "Krea 2")],
)
def test_flux2_shift_is_refused_by_name_on_other_models(family, label):
    flow = FlowSection(timestep_sampling="flux2_shift")
    with pytest.raises(ConfigError) as refused:
        family(flow).check_options(_MODEL, flow)
    message = str(refused.value)
    assert "\n" not in message
    assert f"musubi-tuner's draw for FLUX.2, not {label}" in message and "flux_shift" in message
