"""Qwen-Image's objective reads musubi-tuner's draw and loss words as musubi-tuner's trainer
does: timestep_sampling qwen_shift shifts by the image's size, and weighting_scheme sigma_sqrt /
cosmap weight each sample's loss (musubi-tuner multiplies the raw-output MSE by the SD3 paper's
weight), where the objective compared the raw output unweighted before."""

from __future__ import annotations

import math

import pytest
import torch

from library.config.flow_schema import FlowSection
from library.models.families.qwenimage.objective import DRAW, QwenImageFlowObjective
from library.training.loss import LossOptions

SIGMAS = torch.tensor([0.0, 0.1, 0.5, 0.9, 1.0])


def _objective(**flow) -> QwenImageFlowObjective:
    return QwenImageFlowObjective(DRAW.options(FlowSection(**flow)))


@pytest.mark.parametrize(
    ("scheme", "weight"),
    [
        ("sigma_sqrt", lambda s: 0.0 if s == 0 else s**-2),
        ("cosmap", lambda s: 2 / (math.pi * (1 - 2 * s + 2 * s * s))),
    ],
)
def test_sd3_weighting_schemes_weight_the_loss(scheme, weight):
    weights = _objective(weighting_scheme=scheme).level_weights(LossOptions(), SIGMAS)
    expected = torch.tensor([weight(float(s)) for s in SIGMAS])
    torch.testing.assert_close(weights, expected)


@pytest.mark.parametrize("scheme", [None, "none", "logit_normal", "uniform"])
def test_other_schemes_leave_the_loss_unweighted(scheme):
    flow = {} if scheme is None else {"weighting_scheme": scheme}
    assert _objective(**flow).level_weights(LossOptions(), SIGMAS) is None


def test_qwen_shift_draws_by_the_latents_size():
    objective = _objective(timestep_sampling="qwen_shift")
    assert "timestep_sampling qwen_shift" in objective.describe()
    z = torch.tensor([-1.0, 0.0, 2.0])

    class Draws:
        time_normal = z
        time_uniform = torch.tensor([0.2, 0.5, 0.7])

    # 1328 x 1328 px: 166 x 166 latents, 83 x 83 tokens
    sigmas = objective.levels(Draws, (3, 16, 1, 166, 166))
    shift = math.exp(0.5 + (83 * 83 - 256) * 0.4 / (8192 - 256))
    t = torch.sigmoid(z)
    torch.testing.assert_close(sigmas, t * shift / (1 + (shift - 1) * t))
