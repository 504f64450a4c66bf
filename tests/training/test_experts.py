"""Routing of a model's denoiser experts (library.training.experts): the boundary's scales, the
expert each optimizer step trains, the levels each sample is drawn at, and a file's expert.

The step's routing is checked through the real loss (``micro_batch_loss``) with a family whose
``predict`` records which module ran at which levels: a step that used the wrong expert, or an
expert at a level outside its range, fails here."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from library.config.schema import Config
from library.errors import CheckpointError, ConfigError
from library.models.experts import HIGH_NOISE, LOW_NOISE, Experts
from library.training.experts import (
    EXPERT_KEY,
    ExpertRouting,
    boundary,
    check_expert_config,
    check_file_expert,
    expert_metadata,
    expert_ranges,
    range_shares,
)
from library.training.noise import draw
from library.training.objectives import FlowMatchingObjective, FlowOptions
from library.training.step import StepInputs, micro_batch_loss

SHAPE = (4, 8, 8)  # one sample's latents


def _config(**experts) -> Config:
    return Config(model={"pretrained_model_name_or_path": "x"}, experts=experts)


def _experts(ratio: float | None = 0.875) -> Experts:
    return Experts({HIGH_NOISE: torch.nn.Identity(), LOW_NOISE: torch.nn.Identity()}, ratio)


def _uniform() -> FlowMatchingObjective:
    return FlowMatchingObjective(FlowOptions(timestep_sampling="uniform"), patch=2)


@pytest.mark.parametrize(("given", "expected"), [(None, 0.875), (0.9, 0.9), (900, 0.9), (1.0, 1.0)])
def test_the_boundary_is_musubi_tuners_on_either_scale_else_the_models(given, expected):
    assert boundary(_config(timestep_boundary=given), _experts()) == pytest.approx(expected)


def test_a_model_without_a_boundary_needs_timestep_boundary():
    with pytest.raises(ConfigError, match="set timestep_boundary"):
        boundary(_config(), _experts(None))


def test_expert_keys_on_a_model_with_one_denoiser_are_refused_and_unset_ones_are_not():
    check_expert_config(_config(), None)  # nothing written, nothing refused
    with pytest.raises(ConfigError, match="train_experts .*one denoiser"):
        check_expert_config(_config(train_experts="both"), None)


def test_ranges_split_at_the_boundary_and_train_experts_picks_them():
    both = expert_ranges(_config(timestep_boundary=0.6), _experts())
    assert [(r.name, r.low, r.high) for r in both.values()] == [
        (HIGH_NOISE, 0.6, 1.0), (LOW_NOISE, 0.0, 0.6)
    ]  # fmt: skip
    high = both[HIGH_NOISE]
    assert high.holds(torch.tensor([0.6, 1.0, 0.59])).tolist() == [True, True, False]
    assert both[LOW_NOISE].holds(torch.tensor([0.0, 0.6])).tolist() == [True, False]
    only = expert_ranges(_config(train_experts="low_noise"), _experts())
    assert list(only) == [LOW_NOISE]


class _Recorder(torch.nn.Module):
    """A denoiser that returns its input scaled by a trained weight (so the loss has a gradient)."""

    def __init__(self):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(()))

    def forward(self, x):
        return x * self.weight


class _Family:
    """Just enough of a ModelFamily for micro_batch_loss; ``predict`` records what ran."""

    conditioning_draws = 0
    text_reads_references = False
    FIRST_FRAME_CONDITION = False

    def __init__(self):
        self.calls: list[tuple[torch.nn.Module, list[float]]] = []

    def latent_codec(self, vae):
        return SimpleNamespace(to_latents=lambda x: x)

    def predict(self, denoiser, noisy, timesteps, cond):
        self.calls.append((denoiser, timesteps.tolist()))
        return denoiser(noisy)


def _inputs(routing: ExpertRouting, family: _Family) -> StepInputs:
    return StepInputs(
        denoiser=torch.nn.Identity(), vae=None, family=family, objective=_uniform(),
        text_encoders=(), tokenizers=(), train_text_encoder=False, weight_dtype=torch.float32,
        device=torch.device("cpu"), seed=3, text_cache=SimpleNamespace(), experts=routing,
    )  # fmt: skip


def _batch(positions: list[int]) -> dict:
    n = len(positions)
    return {
        "latent_means": torch.zeros(n, *SHAPE), "latent_stds": torch.ones(n, *SHAPE),
        "positions": torch.tensor(positions), "epoch": 0, "loss_weights": torch.ones(n),
        "captions": ["a"] * n,
    }  # fmt: skip


@pytest.fixture
def routed(monkeypatch):
    """Two recorder experts split at 0.6 under a uniform draw, and the recording family."""
    import library.training.step as step
    import library.training.validation as validation

    for module in (step, validation):  # no captions to encode
        monkeypatch.setattr(module, "batch_conditioning", lambda s, batch: None)
    modules = {HIGH_NOISE: _Recorder(), LOW_NOISE: _Recorder()}
    ranges = expert_ranges(_config(timestep_boundary=0.6), _experts())
    return ExpertRouting(ranges, modules), _Family()


def test_each_step_trains_one_expert_at_levels_of_its_range_only(routed):
    routing, family = routed
    s = _inputs(routing, family)
    used = []
    for step in range(40):
        routing.step = step
        for module in routing.modules.values():
            module.weight.grad = None
        micro_batch_loss(s, _batch([2 * step, 2 * step + 1])).backward()
        ((module, levels),) = family.calls[-1:]
        name = next(n for n, m in routing.modules.items() if m is module)
        assert all(routing.ranges[name].holds(torch.tensor(levels))), (step, name, levels)
        # only that expert's weights got a gradient
        other = routing.modules[LOW_NOISE if name == HIGH_NOISE else HIGH_NOISE]
        assert module.weight.grad is not None and other.weight.grad is None
        used.append(name)
    assert set(used) == {HIGH_NOISE, LOW_NOISE}


def test_a_steps_expert_and_levels_do_not_depend_on_how_its_samples_are_split(routed):
    """The same step as one micro-batch of 4, or as 2 micro-batches of 2 (accumulation, or two
    processes): the same expert and the same level for every sample."""
    routing, family = routed
    s = _inputs(routing, family)
    for step in range(12):
        routing.step = step
        positions = [4 * step + i for i in range(4)]
        micro_batch_loss(s, _batch(positions))
        whole = family.calls[-1]
        micro_batch_loss(s, _batch(positions[:2]))
        micro_batch_loss(s, _batch(positions[2:]))
        first, second = family.calls[-2:]
        assert whole[0] is first[0] is second[0]
        assert whole[1] == pytest.approx(first[1] + second[1])


def test_over_many_steps_the_levels_follow_the_runs_distribution(routed):
    """Uniform sigma split at 0.6: the high-noise expert gets about 40% of the steps, and within
    each expert the levels are uniform over its range (its mean is the range's middle)."""
    routing, family = routed
    s = _inputs(routing, family)
    steps = 400
    for step in range(steps):
        routing.step = step
        micro_batch_loss(s, _batch([step]))
    high = [lv for m, (lv,) in family.calls if m is routing.modules[HIGH_NOISE]]
    low = [lv for m, (lv,) in family.calls if m is routing.modules[LOW_NOISE]]
    assert len(high) / steps == pytest.approx(0.4, abs=0.07)
    assert sum(high) / len(high) == pytest.approx(0.8, abs=0.03)
    assert sum(low) / len(low) == pytest.approx(0.3, abs=0.04)


def test_the_plans_shares_are_the_distributions_mass_in_each_range():
    ranges = expert_ranges(_config(timestep_boundary=0.6), _experts())
    shares = range_shares(_uniform(), ranges, SHAPE)
    assert shares[HIGH_NOISE] == pytest.approx(0.4, abs=0.04)
    # sigmoid of a standard normal: the mass above 0.6 is P(z > logit(0.6))
    sigmoid = FlowMatchingObjective(FlowOptions(timestep_sampling="sigmoid"), patch=2)
    expected = 1 - torch.distributions.Normal(0, 1).cdf(torch.logit(torch.tensor(0.6))).item()
    assert range_shares(sigmoid, ranges, SHAPE)[HIGH_NOISE] == pytest.approx(expected, abs=0.04)


def test_one_trained_expert_takes_every_step_at_its_own_levels():
    ranges = expert_ranges(_config(timestep_boundary=0.6, train_experts="high_noise"), _experts())
    routing = ExpertRouting(ranges, {HIGH_NOISE: _Recorder()})
    objective = _uniform()
    draws = draw(1, 0, list(range(64)), SHAPE, 1000, torch.device("cpu"), flow_times=True)
    expert = routing.choose(objective, draws, SHAPE, 1)
    levels = routing.levels_within(objective, draws, SHAPE, (1, 0, list(range(64))), expert)
    assert expert.name == HIGH_NOISE and bool((levels >= 0.6).all())


def test_a_file_of_the_other_expert_is_refused_by_name():
    high = expert_ranges(_config(timestep_boundary=0.6), _experts())[HIGH_NOISE]
    metadata = expert_metadata(high)
    assert metadata[EXPERT_KEY] == HIGH_NOISE
    check_file_expert(metadata, HIGH_NOISE, "a.safetensors")
    check_file_expert({}, LOW_NOISE, "plain.safetensors")  # a file that names no expert
    with pytest.raises(CheckpointError, match="a.safetensors is a LoRA of the high_noise expert"):
        check_file_expert(metadata, LOW_NOISE, "a.safetensors")


def test_offload_moves_only_frozen_weights_and_only_when_the_expert_changes(monkeypatch):
    """offload_inactive_dit: the frozen weights of the expert a step uses come to the device,
    the other's go to the host, and a step on the same expert moves nothing."""
    import library.training.experts as experts

    moves = []
    monkeypatch.setattr(experts, "place_frozen", lambda m, device: moves.append((m, str(device))))
    modules = {HIGH_NOISE: torch.nn.Linear(1, 1), LOW_NOISE: torch.nn.Linear(1, 1)}
    ranges = expert_ranges(_config(timestep_boundary=0.6), _experts())
    routing = ExpertRouting(ranges, modules, offload=True)
    routing.module(ranges[HIGH_NOISE], "cuda:0")
    assert moves == [(modules[LOW_NOISE], "cpu"), (modules[HIGH_NOISE], "cuda:0")]
    routing.module(ranges[HIGH_NOISE], "cuda:0")
    assert len(moves) == 2
    routing.module(ranges[LOW_NOISE], "cuda:0")
    assert moves[2:] == [(modules[HIGH_NOISE], "cpu"), (modules[LOW_NOISE], "cuda:0")]


def test_validation_runs_each_level_on_the_expert_that_owns_it(routed):
    from library.training.validation import batch_validation_loss

    routing, family = routed
    batch = {**_batch([0, 1]), "validation_keys": ["a", "b"]}
    batch_validation_loss(_inputs(routing, family), batch, [0.3, 0.8], seed=1)
    assert [module for module, _ in family.calls] == [
        routing.modules[LOW_NOISE],
        routing.modules[HIGH_NOISE],
    ]
