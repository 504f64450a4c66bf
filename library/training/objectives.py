"""Training objectives: what a denoiser learns, behind one interface.

An objective owns everything that depends on the kind of diffusion a model was trained with:
the per-sample noise level drawn from the keyed draws, how latents are noised, what the model's
output is compared with, the loss weights that depend on the noise level, the fixed levels
validation evaluates, and the schedule the sampler runs. ``step.py``, ``loss.py`` and
``validation.py`` call it and know nothing of ``alphas_cumprod`` or sigmas.

``DDPMObjective`` is the discrete DDPM objective of SD 1.x/2.x/SDXL (epsilon or v target, integer
timesteps, SNR-based weights). A noise level ``t`` is whatever the objective keeps per sample
(integer timesteps here); only the objective interprets it.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

import torch

from library.errors import ConfigError
from library.training.loss import LossOptions, huber_thresholds, signal_to_noise, timestep_weights
from library.training.noise import NoiseOptions, SampleDraws, draw


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

    @abstractmethod
    def check(self, noise: NoiseOptions, loss: LossOptions) -> None:
        """ConfigError for noise or loss options that do not fit this objective."""

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
    def levels(self, draws: SampleDraws) -> torch.Tensor:
        """Each sample's noise level t [B], from its draws."""

    @abstractmethod
    def noisy(self, latents: torch.Tensor, noise: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        """The latents noised to level ``t``: the denoiser's input."""

    @abstractmethod
    def target(self, latents: torch.Tensor, noise: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        """What the prediction is compared with."""

    @abstractmethod
    def model_time(self, t: torch.Tensor) -> torch.Tensor:
        """The timestep argument the denoiser receives for level ``t``."""

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

    def check(self, noise: NoiseOptions, loss: LossOptions) -> None:
        loss.check(self.v_prediction)
        noise.timestep_range(self.num_train_timesteps)

    def draws(self, seed, epoch, positions, latent_shape, device, noise) -> SampleDraws:
        return draw(
            seed, epoch, positions, tuple(latent_shape), self.num_train_timesteps, device, noise
        )

    def levels(self, draws: SampleDraws) -> torch.Tensor:
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
        from library.sampling.samplers import build_sampler

        return build_sampler(name, self.scheduler.config, self.prediction_type)
