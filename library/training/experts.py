"""Training a model with denoiser experts (library.models.experts): which experts train, the
noise levels each owns, and the routing of every optimizer step to one of them.

Each expert owns a range of noise levels split at the boundary (``timestep_boundary``, else the
model's ``boundary_ratio``): the high-noise expert [boundary, 1], the low-noise one
[0, boundary). A run trains both, or one. With both, each optimizer step trains ONE expert,
chosen from a draw keyed by (seed, step) alone: the same on every process and for every
micro-batch of the step's accumulation window, so DDP reduces exactly that expert's adapter and
no process idles. The draw is a noise level from the run's own distribution (the objective's
draw at the step's latent size), so an expert gets the steps whose level falls in its range, in
proportion to that range's share; each sample's own level is then drawn again from its own key
until it lies in the step's range. Over many steps the levels trained follow the run's
distribution, each on the expert that denoises them."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import torch

from library.config.schema import Config
from library.errors import CheckpointError, ConfigError, TrainingError
from library.models.experts import EXPERT_NAMES, HIGH_NOISE, LOW_NOISE, Experts
from library.saving.output_names import expert_file
from library.training.level_redraw import (
    MAX_REDRAWS,
    MIN_SHARE,
    check_level_range,
    fixed_levels,
    keyed_seeds,
    plan_latent_shape,
    redraw_until,
    time_inputs,
)
from library.training.noise import SampleDraws, sample_seed
from library.training.objectives import FlowMatchingObjective

# The streams of the routing draws: one per optimizer step, one per sample and redraw.
STEP_STREAM = "expert_step"
REDRAW_STREAM = "expert_level"


@dataclass(frozen=True)
class ExpertRange:
    """The noise levels an expert owns, as fractions of the schedule: [low, high), the top one
    [low, 1] closed."""

    name: str
    low: float
    high: float

    def holds(self, fractions: torch.Tensor) -> torch.Tensor:
        below = fractions <= self.high if self.high >= 1 else fractions < self.high
        return (fractions >= self.low) & below

    def text(self) -> str:
        return f"[{self.low:g}, {self.high:g}{']' if self.high >= 1 else ')'}"


def expert_module_name(expert: str) -> str:
    """An expert's name among the trained modules (state keys, parameter groups)."""
    return f"unet_{expert}"


def boundary(config: Config, experts: Experts) -> float:
    """The boundary between the experts as a fraction: ``timestep_boundary`` (musubi-tuner's
    word and scales: [0, 1], or a timestep above 1 divided by 1000), else the model's
    ``boundary_ratio``; ConfigError when neither gives one."""
    given = config.experts.boundary_fraction
    if given is not None:
        return given
    if experts.boundary_ratio is None:
        raise ConfigError(
            "this model's config gives no boundary_ratio between its high-noise and low-noise "
            "experts; set timestep_boundary (e.g. 0.875, at or above which the high-noise "
            "expert denoises)"
        )
    return experts.boundary_ratio


def expert_ranges(config: Config, experts: Experts) -> dict[str, ExpertRange]:
    """The ranges of the experts the run trains (``train_experts``, unset: both), in
    EXPERT_NAMES order."""
    split = boundary(config, experts)
    ranges = {
        HIGH_NOISE: ExpertRange(HIGH_NOISE, split, 1.0),
        LOW_NOISE: ExpertRange(LOW_NOISE, 0.0, split),
    }
    chosen = config.experts.train_experts or "both"
    names = EXPERT_NAMES if chosen == "both" else (chosen,)
    return {name: ranges[name] for name in names}


def check_expert_config(config: Config, experts: Experts | None) -> None:
    """Refuse, before any weight is read, expert keys on a model without experts and what an
    expert run cannot do; nothing the user did not write is refused."""
    section = config.experts
    given = [k for k in type(section).model_fields if getattr(section, k) is not None]
    if experts is None:
        if given:
            raise ConfigError(
                f"{given[0]} chooses between a model's denoiser experts and this model has one "
                "denoiser; remove it"
            )
        return
    if config.training.fsdp != "no":
        raise ConfigError('fsdp does not shard a model\'s denoiser experts yet; set fsdp = "no"')
    if section.offload_inactive_dit and config.training.blocks_to_swap:
        raise ConfigError(
            "offload_inactive_dit moves a whole expert to host memory and blocks_to_swap keeps "
            "part of each there already; use one of them (as musubi-tuner does)"
        )
    ranges = expert_ranges(config, experts)
    if len(ranges) > 1 and config.network.network_weights:
        raise ConfigError(
            f"network_weights = {config.network.network_weights} starts one expert's adapter and "
            "this run trains both; set train_experts to the file's expert (high_noise or "
            "low_noise), or resume from a state"
        )
    empty = [r for r in ranges.values() if r.high <= r.low]
    if empty:
        raise ConfigError(
            f"the {empty[0].name} expert's noise levels {empty[0].text()} are empty at "
            f"timestep_boundary {boundary(config, experts):g}; set a boundary inside (0, 1)"
        )


def _step_draws(draws: SampleDraws, seed: int) -> SampleDraws:
    """One sample's level inputs drawn from ``seed``: the draw that routes a step."""
    normal, uniform = time_inputs([seed], draws.time_normal.device)
    return dataclasses.replace(draws, time_normal=normal, time_uniform=uniform)


@dataclass
class ExpertRouting:
    """The trained experts' ranges and the modules whose forward runs for each (prepared:
    DDP-wrapped under several processes); see the module's docstring."""

    ranges: dict[str, ExpertRange]
    modules: Mapping[str, torch.nn.Module]
    offload: bool = False  # offload_inactive_dit: the unused expert's frozen weights on the host
    active: str | None = None
    # the 0-based optimizer step whose micro-batches run now: the trainer sets it, so the loss's
    # signature (which tests and tools wrap) stays that of a one-denoiser model
    step: int = 0

    def choose(self, objective, draws: SampleDraws, shape, seed: int) -> ExpertRange:
        """The expert optimizer step ``self.step`` trains: the one whose range holds a level
        drawn from the run's distribution by (seed, step) alone (with
        preserve_distribution_shape, drawn again until it lies in min_timestep..max_timestep)."""
        if len(self.ranges) == 1:
            return next(iter(self.ranges.values()))
        one = _step_draws(draws, sample_seed(seed, self.step, 0, STEP_STREAM))
        level = redraw_until(
            objective, one, shape, objective.range_holds,
            lambda attempt: [sample_seed(seed, self.step, 0, f"{STEP_STREAM}:{attempt}")],
        )  # fmt: skip
        if level is None:
            raise TrainingError(
                f"no noise level in min_timestep..max_timestep ({objective.range_text()}) after "
                f"{MAX_REDRAWS} draws; widen the range or change timestep_sampling"
            )
        fraction = objective.level_fraction(level)
        return next(r for r in self.ranges.values() if bool(r.holds(fraction).all()))

    def levels_within(
        self,
        objective,
        draws: SampleDraws,
        shape,
        key: tuple[int, int, list[int]],
        expert: ExpertRange,
    ) -> torch.Tensor:
        """Each sample's level, drawn from its own key (seed, epoch, position) until it lies in
        ``expert``'s range (and, with preserve_distribution_shape, in min_timestep..
        max_timestep): the run's distribution restricted to that range."""

        def holds(levels: torch.Tensor) -> torch.Tensor:
            return expert.holds(objective.level_fraction(levels)) & objective.range_holds(levels)

        levels = redraw_until(objective, draws, shape, holds, keyed_seeds(key, REDRAW_STREAM))
        if levels is not None:
            return levels
        raise TrainingError(
            f"no noise level in the {expert.name} expert's range {expert.text()} after "
            f"{MAX_REDRAWS} draws; move timestep_boundary or change timestep_sampling"
        )

    def module(self, expert: ExpertRange, device) -> torch.nn.Module:
        """The module that trains ``expert``; with ``offload``, the other experts' frozen
        weights go to host memory and this one's come to ``device`` first."""
        if self.offload and self.active != expert.name:
            for name, module in self.modules.items():
                if name != expert.name:
                    place_frozen(module, torch.device("cpu"))
            place_frozen(self.modules[expert.name], device)
            self.active = expert.name
        return self.modules[expert.name]


def place_frozen(module: torch.nn.Module, device) -> None:
    """Move ``module``'s frozen parameters and its buffers to ``device``; the trained ones stay
    where they are (the optimizer's state and DDP's buckets point at them)."""
    module = getattr(module, "module", module)  # a DDP wrapper's module
    for param in module.parameters():
        if not param.requires_grad and param.device != torch.device(device):
            param.data = param.data.to(device)
    for sub in module.modules():
        for name, buffer in sub.named_buffers(recurse=False):
            if buffer.device != torch.device(device):
                sub._buffers[name] = buffer.to(device)


def range_shares(
    objective, ranges: Mapping[str, ExpertRange], latent_shape, seed: int = 0
) -> dict[str, float]:
    """Each range's share of the run's level distribution at ``latent_shape`` (one sample's),
    from a fixed set of draws: the part of the steps its expert trains (both trained)."""
    levels = fixed_levels(objective, latent_shape, seed)
    # with preserve_distribution_shape the steps' levels are those in min..max
    levels = levels[objective.range_holds(levels)]
    fractions = objective.level_fraction(levels)
    return {name: float(r.holds(fractions).float().mean()) for name, r in ranges.items()}


def check_shares(shares: Mapping[str, float], ranges: Mapping[str, ExpertRange]) -> None:
    """ConfigError for a trained range the level distribution almost never reaches."""
    for name, share in shares.items():
        if share < MIN_SHARE:
            raise ConfigError(
                f"the run's noise levels fall in the {name} expert's range {ranges[name].text()} "
                f"{share:.1%} of the time, too rarely to train it; move timestep_boundary or "
                "change timestep_sampling / discrete_flow_shift"
            )


def plan_lines(ranges: Mapping[str, ExpertRange], shares: Mapping[str, float] | None) -> list[str]:
    """The plan's lines: each trained expert, its noise levels and its part of the steps."""
    lines = []
    for name, r in ranges.items():
        part = ""
        if len(ranges) > 1 and shares is not None:
            part = f", about {shares[name]:.0%} of the steps"
        elif len(ranges) == 1:
            part = ", every step"
        lines.append(f"expert {name}: noise levels {r.text()}{part}")
    return lines


# The header keys of an expert's file: which expert it is for, and the noise levels it trained.
EXPERT_KEY = "ss_expert"
EXPERT_LEVELS_KEY = "ss_expert_noise_levels"


def expert_metadata(expert: ExpertRange) -> dict[str, str]:
    """What an expert's file says of it (written with no_metadata too: loaders need it)."""
    return {EXPERT_KEY: expert.name, EXPERT_LEVELS_KEY: expert.text()}


def check_file_expert(metadata: Mapping[str, str] | None, expert: str | None, source) -> None:
    """CheckpointError when ``network_weights`` is a file of another expert than the one the
    run trains (``expert``; None: a model with one denoiser, which takes any file)."""
    named = (metadata or {}).get(EXPERT_KEY)
    if expert is None or named is None or named == expert:
        return
    raise CheckpointError(
        f"network_weights = {source} is a LoRA of the {named} expert and this run trains the "
        f'{expert} expert; give that expert\'s file, or set train_experts = "{named}"'
    )


def offloads(config: Config, experts: Experts | None) -> bool:
    """Whether the inactive expert waits in host memory (offload_inactive_dit, both trained)."""
    return bool(experts is not None and config.experts.offload_inactive_dit)


def move_denoisers(config: Config, components, device) -> None:
    """The denoisers that train to ``device`` (an expert the run does not train stays in host
    memory); with offload_inactive_dit only the experts' trained parameters, their frozen
    weights coming when a step first uses the expert."""
    experts = components.experts
    if experts is None:
        components.denoiser.to(device)
        return
    for module in experts_on_device(config, experts):
        if offloads(config, experts):
            for param in module.parameters():
                if param.requires_grad:
                    param.data = param.data.to(device)
        else:
            module.to(device)


def experts_on_device(config: Config, experts: Experts) -> list[torch.nn.Module]:
    """The experts the run trains (those it does not train are never used)."""
    return [experts.modules[name] for name in expert_ranges(config, experts)]


def expert_for_level(
    routing: ExpertRouting | None, objective, level, device
) -> torch.nn.Module | None:
    """The trained expert whose range holds ``level`` (a level tensor, one value for every
    sample), unwrapped from DDP; None without experts or where no trained expert owns it."""
    if routing is None:
        return None
    fraction = objective.level_fraction(level)
    for expert in routing.ranges.values():
        if bool(expert.holds(fraction).all()):
            module = routing.module(expert, device)
            return getattr(module, "module", module)
    return None


def expert_routing(
    config: Config, parts, prepared: Mapping[str, torch.nn.Module]
) -> ExpertRouting | None:
    """The step routing of a run with experts (None without): the trained experts' ranges and
    their prepared modules."""
    experts = parts.components.experts
    if experts is None:
        return None
    ranges = expert_ranges(config, experts)
    modules = {name: prepared[expert_module_name(name)] for name in ranges}
    return ExpertRouting(ranges, modules, offloads(config, experts))


def expert_plan(config: Config, components) -> dict | None:
    """What the plan says of the experts (None for a model with one): the boundary and, for
    each trained expert, its noise levels and its part of the steps at the first dataset's
    resolution. ConfigError for a range the run's draw almost never reaches: an expert's, or
    on any model preserve_distribution_shape's (level_redraw.check_level_range)."""
    check_level_range(config, components)
    experts = components.experts
    if experts is None:
        return None
    if not isinstance(components.objective, FlowMatchingObjective):  # the redraws are its levels'
        raise ConfigError(
            f"denoiser experts train with a flow-matching objective; this model's is {components.objective.name}"
        )
    ranges = expert_ranges(config, experts)
    shape = plan_latent_shape(config, components)
    shares = range_shares(components.objective, ranges, shape) if len(ranges) > 1 else None
    if shares is not None:
        check_shares(shares, ranges)
    return {
        "boundary": boundary(config, experts),
        "offload_inactive_dit": offloads(config, experts),
        "experts": [
            {
                "name": n,
                "noise_levels": [r.low, r.high],
                "share_of_steps": 1.0 if shares is None else shares[n],
            }
            for n, r in ranges.items()
        ],
        "lines": [
            *plan_lines(ranges, shares),
            f"one file per expert: {', '.join(expert_file(Path(config.saving.output_name), n).name for n in ranges)}",
        ],
    }
