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
