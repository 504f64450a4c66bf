"""preserve_distribution_shape (musubi-tuner's): a sample's noise level is drawn again until it
lies in min_timestep..max_timestep, so the levels follow the run's draw conditioned on the range;
without it they are the draw scaled linearly into the range. Proven on Wan's objective against
the unconditioned draw filtered to the range."""

from __future__ import annotations

import pytest
import torch

from library.errors import ConfigError, TrainingError
from library.models.experts import HIGH_NOISE, LOW_NOISE, Experts
from library.models.families.wan.family import WanFlowObjective
from library.training.experts import ExpertRouting, expert_ranges, range_shares
from library.training.level_redraw import check_range_share, levels_in_range
from library.training.loss import LossOptions
from library.training.noise import NoiseOptions, draw
from library.training.objectives import FlowMatchingObjective, FlowOptions

SHAPE = (16, 1, 4, 4)
N = 4000
QUANTILES = torch.tensor([0.1, 0.25, 0.5, 0.75, 0.9])


def _wan(sampling: str = "sigmoid", **noise) -> WanFlowObjective:
    objective = WanFlowObjective(FlowOptions(timestep_sampling=sampling), patch=2)
    objective.check(NoiseOptions(**noise), LossOptions())
    return objective


def _levels(objective, positions: list[int], seed: int = 7) -> torch.Tensor:
    draws = draw(seed, 0, positions, SHAPE, 1000, torch.device("cpu"), flow_times=True)
    return levels_in_range(objective, draws, SHAPE, (seed, 0, positions))


def test_the_levels_are_the_runs_draw_conditioned_on_the_range():
    kept = _levels(_wan(min_timestep=200, max_timestep=700, preserve_distribution_shape=True),
                   list(range(N)))  # fmt: skip
    assert bool(((kept >= 0.2) & (kept <= 0.7)).all())
    # independent: a larger unconditioned draw (no range), filtered to the range
    whole = _levels(_wan(), list(range(4 * N)), seed=11)
    filtered = whole[(whole >= 0.2) & (whole <= 0.7)]
    expected = torch.quantile(filtered, QUANTILES)
    torch.testing.assert_close(torch.quantile(kept, QUANTILES), expected, atol=0.015, rtol=0)
    # the default (scaled into the range) is another distribution: the test can tell them apart
    scaled = _levels(_wan(min_timestep=200, max_timestep=700), list(range(N)))
    assert (torch.quantile(scaled, QUANTILES) - expected).abs().max() > 0.03


def test_a_samples_level_does_not_depend_on_its_batch():
    objective = _wan("shift", min_timestep=875, max_timestep=1000, preserve_distribution_shape=True)
    whole = _levels(objective, list(range(8)))
    halves = torch.cat([_levels(objective, [0, 1, 2, 3]), _levels(objective, [4, 5, 6, 7])])
    torch.testing.assert_close(whole, halves, rtol=0, atol=0)


def test_a_range_the_draw_never_reaches_is_named():
    objective = _wan(min_timestep=500, max_timestep=500, preserve_distribution_shape=True)
    with pytest.raises(TrainingError, match="preserve_distribution_shape"):
        _levels(objective, [0, 1])


def test_a_model_whose_draw_takes_no_range_refuses_it_by_name():
    objective = FlowMatchingObjective(FlowOptions(timestep_sampling="sigmoid"), patch=2)
    with pytest.raises(ConfigError, match="preserve_distribution_shape"):
        objective.check(NoiseOptions(preserve_distribution_shape=True), LossOptions())


def test_an_experts_levels_lie_in_both_its_range_and_min_max():
    from library.config.schema import Config

    config = Config(model={"pretrained_model_name_or_path": "x"},
                    experts={"timestep_boundary": 0.5, "train_experts": "high_noise"})  # fmt: skip
    experts = Experts({HIGH_NOISE: torch.nn.Identity(), LOW_NOISE: torch.nn.Identity()}, 0.5)
    routing = ExpertRouting(expert_ranges(config, experts), {HIGH_NOISE: torch.nn.Identity()})
    objective = _wan(max_timestep=800, preserve_distribution_shape=True)
    positions = list(range(256))
    draws = draw(3, 0, positions, SHAPE, 1000, torch.device("cpu"), flow_times=True)
    expert = routing.choose(objective, draws, SHAPE, 3)
    levels = routing.levels_within(objective, draws, SHAPE, (3, 0, positions), expert)
    assert bool(((levels >= 0.5) & (levels <= 0.8)).all())


def test_a_range_the_draw_almost_never_reaches_is_refused_before_training():
    check_range_share(_wan(min_timestep=200, max_timestep=700, preserve_distribution_shape=True),
                      SHAPE)  # fmt: skip
    check_range_share(_wan(min_timestep=500, max_timestep=500), SHAPE)  # scaled: always there
    objective = _wan(min_timestep=500, max_timestep=500, preserve_distribution_shape=True)
    with pytest.raises(ConfigError, match="preserve_distribution_shape.*falls 0.0%"):
        check_range_share(objective, SHAPE)


def test_the_plans_expert_shares_are_those_of_the_levels_in_min_max():
    from library.config.schema import Config

    config = Config(model={"pretrained_model_name_or_path": "x"},
                    experts={"timestep_boundary": 0.5})  # fmt: skip
    experts = Experts({HIGH_NOISE: torch.nn.Identity(), LOW_NOISE: torch.nn.Identity()}, 0.5)
    objective = _wan(max_timestep=800, preserve_distribution_shape=True)
    shares = range_shares(objective, expert_ranges(config, experts), SHAPE)
    # sigmoid of a standard normal, conditioned on sigma <= 0.8
    below = torch.distributions.Normal(0, 1).cdf(torch.logit(torch.tensor(0.8))).item()
    assert shares[HIGH_NOISE] == pytest.approx((below - 0.5) / below, abs=0.03)
