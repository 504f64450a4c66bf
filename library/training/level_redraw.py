"""Noise levels drawn again until they lie in a range: the objective's own level distribution
conditioned on the range (rejection sampling), each redraw from its own key so a run stays
the same whatever its layout. Used by ``preserve_distribution_shape`` (musubi-tuner's: the
level drawn again until it lies in min_timestep..max_timestep, instead of scaled into it) and
by denoiser experts (library.training.experts: a level inside the step's expert's range)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import torch

from library.errors import ConfigError, TrainingError
from library.training.noise import NoiseOptions, SampleDraws, draw, sample_seed

# As musubi-tuner: a range its draw almost never reaches gives up after this many tries.
MAX_REDRAWS = 1000
RANGE_STREAM = "level_range"
# A range holding less of the draw than this is refused before training (it would redraw
# for long, or give up mid-run).
MIN_SHARE = 0.02
_SHARE_DRAWS = 2000


def time_inputs(seeds: list[int], device) -> tuple[torch.Tensor, torch.Tensor]:
    """One (normal, uniform) pair of level inputs per seed."""
    normal, uniform = [], []
    for seed in seeds:
        gen = torch.Generator().manual_seed(seed)
        normal.append(torch.randn((1,), generator=gen))
        uniform.append(torch.rand((1,), generator=gen))
    return torch.cat(normal).to(device), torch.cat(uniform).to(device)


def levels_from(objective, draws: SampleDraws, shape, seeds: list[int]) -> torch.Tensor:
    """The objective's levels for ``draws`` with their level inputs drawn from ``seeds``."""
    normal, uniform = time_inputs(seeds, draws.time_normal.device)
    return objective.levels(
        dataclasses.replace(draws, time_normal=normal, time_uniform=uniform), shape
    )


def redraw_until(
    objective,
    draws: SampleDraws,
    shape,
    holds: Callable[[torch.Tensor], torch.Tensor],
    seeds_for: Callable[[int], list[int]],
) -> torch.Tensor | None:
    """The objective's levels for ``draws``, each one outside ``holds`` drawn again (attempt
    n from ``seeds_for(n)``) until it lies inside; None when some never did."""
    levels = objective.levels(draws, shape)
    done = holds(levels)
    for attempt in range(1, MAX_REDRAWS + 1):
        if bool(done.all()):
            return levels
        again = levels_from(objective, draws, shape, seeds_for(attempt))
        take = ~done & holds(again)
        levels = torch.where(take, again, levels)
        done = done | take
    return levels if bool(done.all()) else None


def keyed_seeds(key: tuple[int, int, list[int]], stream: str) -> Callable[[int], list[int]]:
    """The redraw seeds of the samples at (seed, epoch, positions), per attempt."""
    seed, epoch, positions = key
    return lambda attempt: [sample_seed(seed, epoch, p, f"{stream}:{attempt}") for p in positions]


def levels_in_range(
    objective, draws: SampleDraws, shape, key: tuple[int, int, list[int]]
) -> torch.Tensor:
    """The samples' levels: the objective's draw, and with ``preserve_distribution_shape``
    each one drawn again from its own key until it lies in min_timestep..max_timestep."""
    if not objective.preserve_shape:
        return objective.levels(draws, shape)
    levels = redraw_until(
        objective, draws, shape, objective.range_holds, keyed_seeds(key, RANGE_STREAM)
    )
    if levels is None:
        raise TrainingError(
            f"no noise level in min_timestep..max_timestep ({objective.range_text()}) after "
            f"{MAX_REDRAWS} draws with preserve_distribution_shape; widen the range or change "
            "timestep_sampling / discrete_flow_shift"
        )
    return levels


def fixed_levels(objective, latent_shape, seed: int = 0) -> torch.Tensor:
    """The objective's (unredrawn) levels of a fixed set of draws at ``latent_shape`` (one
    sample's): the run's distribution, for the plan's shares."""
    draws = draw(
        seed, 0, list(range(_SHARE_DRAWS)), (1, 1, 1), 1000, torch.device("cpu"), flow_times=True
    )
    return objective.levels(draws, tuple(latent_shape))


def check_range_share(objective, latent_shape) -> None:
    """ConfigError, before training, for a preserve_distribution_shape range that the draw at
    ``latent_shape`` almost never reaches."""
    if not objective.preserve_shape:
        return
    share = float(objective.range_holds(fixed_levels(objective, latent_shape)).float().mean())
    if share < MIN_SHARE:
        raise ConfigError(
            f"with preserve_distribution_shape the noise level is drawn again until it lies in "
            f"min_timestep..max_timestep {objective.range_text()}, where the run's draw "
            f"({objective.sampling_text()}) falls {share:.1%} of the time; widen the range, "
            "change timestep_sampling / discrete_flow_shift, or remove "
            "preserve_distribution_shape (the draw is then scaled into the range)"
        )


def plan_latent_shape(config, components) -> tuple[int, ...]:
    """One sample's latent shape at the first dataset's resolution (the plan's draws)."""
    width, height = (
        config.datasets[0].resolution
        if config.datasets
        else (components.family.default_resolution,) * 2
    )
    return tuple(components.family.latent_codec(components.vae).layout.shape(1, height, width)[1:])


def check_level_range(config, components) -> None:
    """Before training: the objective takes the run's min_timestep / max_timestep /
    preserve_distribution_shape (ConfigError where it cannot), and a redraw range the draw
    almost never reaches is refused."""
    objective = components.objective
    if not hasattr(objective, "take_range"):  # DDPM: its draw is uniform in the range already
        return
    objective.take_range(NoiseOptions.from_training(config.training))
    if objective.preserve_shape:
        check_range_share(objective, plan_latent_shape(config, components))
