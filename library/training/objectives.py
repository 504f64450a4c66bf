"""Training objectives: what a denoiser learns, behind one interface.

An objective owns everything that depends on the kind of diffusion a model was trained with:
the per-sample noise level drawn from the keyed draws, how latents are noised, what the model's
output is compared with, the loss weights that depend on the noise level, the fixed levels
validation evaluates, and the schedule the sampler runs. ``step.py``, ``loss.py`` and
``validation.py`` call it and know nothing of ``alphas_cumprod`` or sigmas.

``DDPMObjective`` is the discrete DDPM objective of SD 1.x/2.x/SDXL (epsilon or v target, integer
timesteps, SNR-based weights); ``FlowMatchingObjective`` is rectified flow as kohya trains Flux.1
(sigma in [0, 1], velocity target, library.training.flow_matching's formulas). A noise level
``t`` is whatever the objective keeps per sample (integer timesteps, or sigmas); only the
objective interprets it.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import torch

from library.errors import ConfigError
from library.sampling.samplers import build_flow_sampler, build_sampler
from library.training import flow_matching as fm
from library.training.flow_keys import SIGMA_KEYS
from library.training.loss import LossOptions, huber_thresholds, signal_to_noise, timestep_weights
from library.training.noise import NoiseOptions, SampleDraws, draw

log = logging.getLogger(__name__)


def validation_timesteps(num_train_timesteps: int, count: int = 5) -> list[int]:
    """``count`` timesteps spread evenly over a discrete schedule: the midpoints of ``count``
    equal strata of [0, num_train_timesteps), i.e. floor((2i + 1) * T / (2 * count)), ascending.

    One timestep in each stratum of noise levels, from mostly-signal (fine detail) to
    mostly-noise (composition), skipping the extremes where the loss says little.
    """
    if not 1 <= count <= num_train_timesteps:
        raise ValueError(
            f"count of validation timesteps must be in 1..{num_train_timesteps}, got {count}"
        )
    return [(2 * i + 1) * num_train_timesteps // (2 * count) for i in range(count)]


class Objective(ABC):
    """How one model family is trained and sampled, for the loss and validation code."""

    name: str
    # preserve_distribution_shape: levels outside min_timestep..max_timestep are drawn again
    # (library.training.level_redraw) rather than scaled into it; set by check()
    preserve_shape: bool = False

    @abstractmethod
    def describe(self) -> str:
        """One line for the run plan: the objective and its settings."""

    @abstractmethod
    def check(self, noise: NoiseOptions, loss: LossOptions) -> tuple[NoiseOptions, LossOptions]:
        """The noise and loss options that apply to this objective; ConfigError for options
        that do not fit it, a warning for those it leaves out."""

    @abstractmethod
    def draws(
        self,
        seed: int,
        epoch: int,
        positions: list[int],
        latent_shape: tuple[int, ...],
        device: torch.device,
        noise: NoiseOptions,
    ) -> SampleDraws:
        """Every random input of a micro-batch, keyed per sample (library.training.noise)."""

    @abstractmethod
    def levels(self, draws: SampleDraws, latent_shape: tuple[int, ...]) -> torch.Tensor:
        """Each sample's noise level t [B], from its draws (``latent_shape``: one sample's)."""

    @abstractmethod
    def noisy(self, latents: torch.Tensor, noise: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        """The latents noised to level ``t``: the denoiser's input."""

    @abstractmethod
    def target(self, latents: torch.Tensor, noise: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        """What the prediction is compared with."""

    @abstractmethod
    def model_time(self, t: torch.Tensor) -> torch.Tensor:
        """The timestep argument the denoiser receives for level ``t``."""

    def level_fraction(self, t: torch.Tensor) -> torch.Tensor:
        """Level ``t`` as a fraction of the schedule, 0 clean to 1 pure noise (float32 [B]):
        the scale of denoiser experts' boundaries. A flow objective's sigma is one already."""
        return t.float()

    def prediction(
        self, output: torch.Tensor, noisy: torch.Tensor, t: torch.Tensor
    ) -> torch.Tensor:
        """The denoiser's raw output turned into the quantity compared with the target."""
        return output

    @abstractmethod
    def huber_thresholds(self, options: LossOptions, t: torch.Tensor) -> torch.Tensor:
        """The Huber threshold of each sample at its level (float32 [B])."""

    @abstractmethod
    def level_weights(self, options: LossOptions, t: torch.Tensor) -> torch.Tensor | None:
        """Per-sample loss weights that depend on the noise level, or None when none is on."""

    @abstractmethod
    def validation_levels(self, count: int = 5) -> list:
        """``count`` fixed noise levels validation evaluates every image at, ascending."""

    @abstractmethod
    def level_tensor(self, values: list, device: torch.device) -> torch.Tensor:
        """Validation levels (as ``validation_levels`` gives them) as a level tensor [B]."""

    @abstractmethod
    def sampler(self, name: str):
        """A fresh diffusers scheduler for sampler ``name`` that samples this objective."""


class DDPMObjective(Objective):
    """Discrete-time DDPM (Ho et al. 2020) with an epsilon or v (Salimans & Ho 2022) target.

    ``scheduler`` is a diffusers DDPMScheduler holding the model's beta schedule; it supplies
    alphas_cumprod, add_noise and get_velocity. Levels are integer timesteps in
    [0, num_train_timesteps).
    """

    name = "ddpm"

    def __init__(self, scheduler, v_prediction: bool) -> None:
        self.scheduler = scheduler
        self.v_prediction = v_prediction

    @property
    def prediction_type(self) -> str:
        return "v_prediction" if self.v_prediction else "epsilon"

    @property
    def num_train_timesteps(self) -> int:
        return int(self.scheduler.config.num_train_timesteps)

    def describe(self) -> str:
        target = "v" if self.v_prediction else "epsilon"
        return f"DDPM, {target} target, {self.num_train_timesteps} timesteps"

    def check(self, noise: NoiseOptions, loss: LossOptions) -> tuple[NoiseOptions, LossOptions]:
        loss.check(self.v_prediction)
        noise.timestep_range(self.num_train_timesteps)
        return noise, loss

    def draws(self, seed, epoch, positions, latent_shape, device, noise) -> SampleDraws:
        return draw(
            seed, epoch, positions, tuple(latent_shape), self.num_train_timesteps, device, noise
        )

    def levels(self, draws: SampleDraws, latent_shape: tuple[int, ...]) -> torch.Tensor:
        return draws.timesteps

    def noisy(self, latents, noise, t):
        return self.scheduler.add_noise(latents, noise, t)

    def target(self, latents, noise, t):
        return self.scheduler.get_velocity(latents, noise, t) if self.v_prediction else noise

    def model_time(self, t):
        return t

    def huber_thresholds(self, options, t):
        return huber_thresholds(options, t, self.scheduler.alphas_cumprod)

    def level_weights(self, options, t):
        snr = signal_to_noise(self.scheduler.alphas_cumprod, t)
        return timestep_weights(options, snr, self.v_prediction)

    def validation_levels(self, count: int = 5) -> list[int]:
        return validation_timesteps(self.num_train_timesteps, count)

    def level_tensor(self, values, device):
        total = self.num_train_timesteps
        steps = [int(t) for t in values]
        bad = [t for t in steps if not 0 <= t < total]
        if bad:
            raise ConfigError(
                f"validation timestep {bad[0]} is outside 0..{total - 1}, the model's schedule; "
                "choose timesteps in that range"
            )
        return torch.tensor(steps, dtype=torch.long, device=device)

    def sampler(self, name: str):
        return build_sampler(name, self.scheduler.config, self.prediction_type)


@dataclass(frozen=True)
class FlowOptions:
    """The [flow] training keys with kohya's defaults filled in (Flux's and SD3's keys: each
    family's objective reads its own)."""

    timestep_sampling: str = "sigma"
    sigmoid_scale: float = 1.0
    discrete_flow_shift: float = 3.0
    model_prediction_type: str = "sigma_scaled"
    weighting_scheme: str = "uniform"
    logit_mean: float = 0.0
    logit_std: float = 1.0
    mode_scale: float = 1.29
    training_shift: float = 1.0  # SD3

    @classmethod
    def from_section(cls, flow: object) -> FlowOptions:
        """The options of a FlowSection (unset keys take kohya's defaults)."""
        given = {
            name: getattr(flow, name)
            for name in cls.__dataclass_fields__
            if getattr(flow, name, None) is not None
        }
        return cls(**given)


# Noise keys sd-scripts applies to DDPM only (its Flux.1 trainer draws plain noise).
DDPM_NOISE_KEYS = ("noise_offset", "adaptive_noise_scale", "multires_noise_iterations")
# Loss keys built on DDPM's signal-to-noise ratio: they have no meaning for a flow objective.
_SNR_LOSS_KEYS = (
    "min_snr_gamma",
    "scale_v_pred_loss_like_noise_pred",
    "v_pred_like_loss",
    "debiased_estimation_loss",
)


class FlowMatchingObjective(Objective):
    """Rectified flow (Liu et al. 2022; Esser et al. 2024) as kohya trains Flux.1.

    x_t = (1 - sigma) x0 + sigma noise; the target is the velocity noise - x0; the output is
    turned into the prediction by ``model_prediction_type``. Levels are float sigmas [B]; the
    denoiser receives sigma itself (diffusers' Flux transformer scales it by 1000 inside). The
    draws' ``time_normal``/``time_uniform`` (their own stream) pick each sigma. ``patch``: the
    side of the latent square the family's denoiser makes one token of, by which the
    resolution-dependent draws (flux_shift, qwen_shift) count the image's tokens.
    """

    name = "flow"
    LABEL = "Flux.1"  # the family whose kohya trainer this objective follows, for messages
    # Noise keys that trainer does not apply (it draws plain noise).
    UNUSED_NOISE_KEYS: tuple[str, ...] = DDPM_NOISE_KEYS
    # Whether min/max_timestep narrow the draw (else anything but the whole range is refused).
    TIMESTEP_RANGE = False
    # levels() leaves the draw unscaled when preserve_shape, for the redraw into the range
    RANGE_REDRAW = False
    # The family's own resolution-dependent draws (its entry's timestep_draws): the
    # timestep_sampling value -> mu of the image's token count; sigma is sigmoid(sigmoid_scale
    # * z) shifted by exp(mu), as flux_shift and qwen_shift are with their own lines.
    OWN_SHIFTS: Mapping[str, Callable[[float], float]] = {}

    def __init__(
        self, options: FlowOptions, sampling_scheduler: Mapping | None = None, *, patch: int
    ) -> None:
        own = options.timestep_sampling in self.OWN_SHIFTS
        fm.validate_flow_options(
            timestep_sampling=None if own else options.timestep_sampling,
            sigmoid_scale=options.sigmoid_scale,
            discrete_flow_shift=options.discrete_flow_shift,
            model_prediction_type=options.model_prediction_type,
            weighting_scheme=options.weighting_scheme,
            logit_std=options.logit_std,
            mode_scale=options.mode_scale,
        )
        self.options = options
        # The side of the latent square the family's denoiser makes one token of: the image's
        # token count sets the resolution-dependent shifts (flux_shift, qwen_shift).
        self.patch = patch
        self.min_timestep: int | None = None  # set by check() where TIMESTEP_RANGE
        self.max_timestep: int | None = None
        # The FlowMatchEulerDiscreteScheduler config samples are drawn with (the variant's
        # released one: library.models.families.flux.sampling.flux_scheduler_config).
        self.sampling_scheduler = dict(sampling_scheduler) if sampling_scheduler else None

    def range_fractions(self) -> tuple[float, float]:
        """min_timestep..max_timestep as fractions of the schedule (unset: 0..1)."""
        low = (self.min_timestep or 0) / fm.NUM_TRAIN_TIMESTEPS
        high = 1.0 if self.max_timestep is None else self.max_timestep / fm.NUM_TRAIN_TIMESTEPS
        return low, high

    def range_holds(self, levels: torch.Tensor) -> torch.Tensor:
        """Which levels the redraw keeps: with preserve_shape, those in min_timestep..
        max_timestep, both ends in (as musubi-tuner); otherwise all (the draw is the range's)."""
        fractions = self.level_fraction(levels)
        if not self.preserve_shape:
            return torch.ones_like(fractions, dtype=torch.bool)
        low, high = self.range_fractions()
        return (fractions >= low) & (fractions <= high)

    def range_text(self) -> str:
        low, high = self.range_fractions()
        return f"[{low:g}, {high:g}]"

    def sampling_text(self) -> str:
        """The noise-level draw in the run plan's words: timestep_sampling and the settings it
        reads."""
        o = self.options
        sampling = o.timestep_sampling
        if sampling in fm.SIGMOID_SAMPLINGS or sampling in self.OWN_SHIFTS:
            sampling += f" (sigmoid_scale {o.sigmoid_scale:g})"
        if sampling.startswith(("shift", "sigma")):
            sampling += f", discrete_flow_shift {o.discrete_flow_shift:g}"
        return sampling

    def describe(self) -> str:
        o = self.options
        sampling = self.sampling_text()
        if o.timestep_sampling == "sigma":
            sampling += f", weighting_scheme {o.weighting_scheme}"
        return (
            f"rectified flow, velocity target, timestep_sampling {sampling}, "
            f"model_prediction_type {o.model_prediction_type}"
        )

    def take_range(self, noise: NoiseOptions) -> None:
        """Takes min_timestep / max_timestep where the family's trainer draws in a range
        (TIMESTEP_RANGE), and preserve_distribution_shape where its draw is redrawn into it
        (RANGE_REDRAW); ConfigError for either where not."""
        if self.TIMESTEP_RANGE:
            fm.validate_flow_options(
                min_timestep=noise.min_timestep, max_timestep=noise.max_timestep
            )
            self.min_timestep, self.max_timestep = noise.min_timestep, noise.max_timestep
        elif noise.min_timestep or noise.max_timestep not in (None, fm.NUM_TRAIN_TIMESTEPS):
            raise ConfigError(
                "min_timestep / max_timestep apply to DDPM models; flow-matching models draw "
                "sigma with timestep_sampling (kohya ignores them for Flux.1); remove them"
            )
        if noise.preserve_distribution_shape:
            if not self.RANGE_REDRAW:
                raise ConfigError(
                    "preserve_distribution_shape draws the noise level again until it lies in "
                    "min_timestep..max_timestep, and this model's draw "
                    f"({self.sampling_text()}) does not take that range; remove it"
                )
            self.preserve_shape = True

    def check(self, noise: NoiseOptions, loss: LossOptions) -> tuple[NoiseOptions, LossOptions]:
        """Refuses Huber's snr schedule, and a timestep range narrower than the whole schedule
        unless the family's trainer draws in one (TIMESTEP_RANGE); leaves out, with a warning,
        the SNR weights and the noise keys kohya's trainer for the family does not apply
        (UNUSED_NOISE_KEYS; GUI presets carry them)."""
        self.take_range(noise)
        if loss.loss_type in ("huber", "smooth_l1") and loss.huber_schedule == "snr":
            raise ConfigError(
                f'loss_type = "{loss.loss_type}" with huber_schedule = "snr" needs DDPM\'s '
                'signal-to-noise ratio; set huber_schedule = "constant" or "exponential"'
            )
        unused_loss = {k: getattr(loss, k) for k in _SNR_LOSS_KEYS if getattr(loss, k)}
        unused_noise = {k: getattr(noise, k) for k in self.UNUSED_NOISE_KEYS if getattr(noise, k)}
        unused = {**unused_loss, **unused_noise}
        if unused:
            listed = ", ".join(f"{k} = {v}" for k, v in unused.items())
            log.warning(
                "%s: not used by flow-matching models (sd-scripts ignores them for %s too); "
                "training without them",
                listed,
                self.LABEL,
            )
        loss = dataclasses.replace(loss, **{k: type(v)() for k, v in unused_loss.items()})
        noise = dataclasses.replace(noise, **{k: type(v)() for k, v in unused_noise.items()})
        return noise, loss

    def draws(self, seed, epoch, positions, latent_shape, device, noise) -> SampleDraws:
        return draw(
            seed,
            epoch,
            positions,
            tuple(latent_shape),
            fm.NUM_TRAIN_TIMESTEPS,
            device,
            noise,
            flow_times=True,
        )

    def levels(self, draws: SampleDraws, latent_shape: tuple[int, ...]) -> torch.Tensor:
        o = self.options
        tokens = fm.image_seq_len(*latent_shape[-2:], self.patch)
        own = self.OWN_SHIFTS.get(o.timestep_sampling)
        if own is not None:
            return fm.time_shift_sigmas(
                torch.sigmoid(o.sigmoid_scale * draws.time_normal), own(tokens)
            )
        return fm.flux_sample_sigmas(
            draws.time_normal,
            draws.time_uniform,
            timestep_sampling=o.timestep_sampling,
            sigmoid_scale=o.sigmoid_scale,
            discrete_flow_shift=o.discrete_flow_shift,
            image_seq_len=tokens,
            weighting_scheme=o.weighting_scheme,
            logit_mean=o.logit_mean,
            logit_std=o.logit_std,
            mode_scale=o.mode_scale,
        ).sigmas

    def noisy(self, latents, noise, t):
        return fm.noisy_latents(latents, noise, t)

    def target(self, latents, noise, t):
        return fm.velocity_target(latents, noise)

    def model_time(self, t):
        return t

    def prediction(self, output, noisy, t):
        return fm.apply_model_prediction_type(
            output, noisy.to(output.dtype), t, self.options.model_prediction_type
        ).prediction

    def huber_thresholds(self, options, t):
        """constant: c * scale; exponential: scale * c ** (1000 sigma / 1000), kohya's formula
        over the timestep sigma * 1000."""
        c, scale = options.huber_c, options.huber_scale
        sigma = t.float()
        if options.huber_schedule == "constant":
            return torch.full_like(sigma, c * scale)
        return scale * torch.exp(sigma * math.log(c))

    def level_weights(self, options, t):
        o = self.options
        if o.model_prediction_type != "sigma_scaled" or o.weighting_scheme not in (
            "sigma_sqrt",
            "cosmap",
        ):
            return None
        return fm.loss_weighting(o.weighting_scheme, t)

    def validation_levels(self, count: int = 5) -> list[float]:
        """The midpoints of ``count`` equal strata of sigma in [0, 1], ascending."""
        if count < 1:
            raise ValueError(f"count of validation levels must be >= 1, got {count}")
        return [(2 * i + 1) / (2 * count) for i in range(count)]

    def level_tensor(self, values, device):
        sigmas = [float(v) for v in values]
        bad = [v for v in sigmas if not 0.0 <= v <= 1.0]
        if bad:
            raise ConfigError(f"validation level {bad[0]} is outside sigma's 0..1")
        return torch.tensor(sigmas, dtype=torch.float32, device=device)

    def sampler(self, name: str):
        if self.sampling_scheduler is None:
            raise ValueError("FlowMatchingObjective was built without a sampling_scheduler config")
        return build_flow_sampler(name, self.sampling_scheduler)


def flow_options_over(flow: object, defaults: Mapping[str, object]) -> FlowOptions:
    """The set [flow] draw keys over a family's ``defaults`` (its trainer's suggested draw)."""
    given = {key: getattr(flow, key) for key in SIGMA_KEYS if getattr(flow, key, None) is not None}
    return dataclasses.replace(FlowOptions(), **{**defaults, **given})


def shift_draw(shift: float) -> dict[str, object]:
    """musubi-tuner's suggested draw for the transformers it trains at a fixed shift (the
    defaults ``flow_options_over`` takes): sigma = shift(sigmoid(z)) at ``discrete_flow_shift``
    ``shift``, no loss weighting, the raw output as the prediction."""
    return {"timestep_sampling": "shift", "sigmoid_scale": 1.0, "weighting_scheme": "none",
            "discrete_flow_shift": shift, "model_prediction_type": "raw"}  # fmt: skip


class VelocityObjective(FlowMatchingObjective):
    """Rectified flow whose denoiser takes sigma and returns the velocity noise - x0 as its raw
    output (the pipelines' Euler step takes it as it is: Qwen-Image's, Krea 2's); a
    weighting_scheme of sigma_sqrt or cosmap weights the loss per sample, as musubi-tuner's
    trainers do."""

    def describe(self) -> str:
        return (
            f"rectified flow, velocity target at timestep sigma, timestep_sampling "
            f"{self.sampling_text()}, weighting_scheme {self.options.weighting_scheme}"
        )

    def prediction(self, output, noisy, t):
        return output

    def level_weights(self, options, t):
        return fm.output_loss_weights(self.options.weighting_scheme, t)


class NegatedVelocityObjective(VelocityObjective):
    """Rectified flow whose denoiser takes 1 - sigma (0 at pure noise) and returns the negated
    velocity x0 - noise as its raw output (its pipeline negates it before the Euler step); the
    timestep input is computed as such pipelines do, (1000 - 1000 * sigma) / 1000, so it
    matches theirs bit for bit."""

    def describe(self) -> str:
        return (
            f"rectified flow, x0 - noise target at timestep 1 - sigma, timestep_sampling "
            f"{self.sampling_text()}, weighting_scheme {self.options.weighting_scheme}"
        )

    def target(self, latents, noise, t):
        return latents - noise

    def model_time(self, t):
        return (fm.NUM_TRAIN_TIMESTEPS - t * fm.NUM_TRAIN_TIMESTEPS) / fm.NUM_TRAIN_TIMESTEPS
