"""The shared flow-matching objective takes the image's token count from the family."""

from __future__ import annotations

import math

import pytest
import torch

from library.training.objectives import FlowMatchingObjective, FlowOptions


class _Draws:
    time_normal = torch.tensor([-1.0, 0.0, 2.0])
    time_uniform = torch.tensor([0.2, 0.5, 0.7])


@pytest.mark.parametrize("patch", [1, 2, 4])
def test_flux_shift_counts_the_tokens_of_the_familys_patch(patch):
    """flux_shift's mu is on the line through (256 tokens, 0.5) and (4096, 1.15) at the image's
    token count: one token per patch x patch latents, the patch the family says."""
    objective = FlowMatchingObjective(FlowOptions(timestep_sampling="flux_shift"), patch=patch)
    sigmas = objective.levels(_Draws, (3, 16, 64, 96))
    tokens = (64 // patch) * (96 // patch)
    shift = math.exp(0.5 + (tokens - 256) * (1.15 - 0.5) / (4096 - 256))
    t = torch.sigmoid(_Draws.time_normal)
    torch.testing.assert_close(sigmas, t * shift / (1 + (shift - 1) * t))


def test_the_patch_is_the_familys_to_say():
    with pytest.raises(TypeError, match="patch"):
        FlowMatchingObjective(FlowOptions())  # type: ignore[call-arg]


def test_negated_velocity_objective_reverses_time_and_sign():
    """1 - sigma in, x0 - noise out: the negation of VelocityObjective's target, and a timestep
    input equal to (1000 - 1000 sigma) / 1000 as pipelines compute it."""
    from library.training.objectives import (
        FlowOptions,
        NegatedVelocityObjective,
        VelocityObjective,
    )

    options = FlowOptions(model_prediction_type="raw")
    negated = NegatedVelocityObjective(options, patch=2)
    velocity = VelocityObjective(options, patch=2)
    g = torch.Generator().manual_seed(0)
    x0, noise = torch.randn(2, 4, 4, 4, generator=g), torch.randn(2, 4, 4, 4, generator=g)
    t = torch.tensor([0.25, 0.7])
    assert torch.equal(negated.target(x0, noise, t), -velocity.target(x0, noise, t))
    assert torch.allclose(negated.model_time(t), 1 - t)
    assert torch.equal(negated.model_time(t), (1000 - t * 1000) / 1000)
    assert torch.equal(negated.noisy(x0, noise, t), velocity.noisy(x0, noise, t))
    assert "x0 - noise" in negated.describe()
