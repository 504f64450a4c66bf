"""Validation loss: the plain diffusion loss of held-out images at fixed timesteps and noise.

Every validation image is noised at the same timesteps with the same noise in every evaluation,
so the loss moves only when the model does, and curves compare across runs, process counts and
batch sizes. Its pieces:

- latents: the VAE posterior mean in latent space (no posterior sample);
- timesteps: a fixed list of noise levels (the objective's validation_levels; for DDPM
  validation_timesteps), each image evaluated at every one of them;
- noise: standard normal from a CPU generator seeded with stable_seed(seed, "validation", key,
  t), where key names the image (the batch's "validation_keys"), so an image's noise never
  depends on its batch, rank or run;
- loss: the mean element loss (loss_type, with the Huber threshold of t when Huber), masked by
  the alpha mask if the batch has one, and nothing else: no prior-loss weights, no min-SNR or
  other timestep weights, no noise offset or input perturbation. It measures the objective, not
  the training recipe.

Modes: nothing here switches train/eval mode. Our adapters have no dropout (peft's lora_dropout
is 0) and the base models' dropout is off in trained modules (library.training.setup switches
T5's off; SD's and CLIP's are 0), so both modes compute the same thing; if
adapter dropout is ever added, the caller must put the trained modules in eval mode around
validation. Mixed precision: call it inside the same autocast context as the training step.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Sequence

import torch

from library.data.schedule import stable_seed
from library.errors import ConfigError
from library.training.experts import expert_for_level
from library.training.loss import element_loss
from library.training.objectives import validation_timesteps
from library.training.step import (
    StepInputs,
    batch_conditioning,
    batch_posterior,
    latent_mask,
    predict,
    with_image_inputs,
)

__all__ = [
    "VALIDATION_TIMESTEPS_DEFAULT",
    "NoValidationSamples",
    "validation_loss",
    "validation_timesteps",
]


class NoValidationSamples(ValueError):
    """No process had a (readable) validation sample to score."""


# validation_timesteps(1000): one timestep in each fifth of the noise levels.
VALIDATION_TIMESTEPS_DEFAULT = (100, 300, 500, 700, 900)


def _keys(batch: dict, batch_size: int) -> list[str]:
    keys = batch.get("validation_keys")
    if keys is None or len(keys) != batch_size:
        found = "none" if keys is None else len(keys)
        raise ValueError(
            f"a validation batch of {batch_size} needs as many validation_keys: {found}"
        )
    return [str(key) for key in keys]


def _unwrapped(s: StepInputs) -> StepInputs:
    """``s`` with the DDP wrappers removed: validation must not run DDP's forward, whose buffer
    broadcast is a collective that would hang when ranks hold different numbers of batches."""
    encoders = tuple(getattr(m, "module", m) for m in s.text_encoders)
    return dataclasses.replace(
        s,
        denoiser=getattr(s.denoiser, "module", s.denoiser),
        text_encoders=encoders,
    )


def validation_noise(
    keys: Sequence[str], t: int, seed: int, shape: tuple[int, ...], device: torch.device
) -> torch.Tensor:
    """Standard-normal noise [B, *shape]: image ``keys[i]``'s noise for timestep ``t``, drawn on
    the CPU (the same numbers on every device) from stable_seed(seed, "validation", key, t)."""
    draws = [
        torch.randn(
            shape, generator=torch.Generator().manual_seed(stable_seed(seed, "validation", key, t))
        )
        for key in keys
    ]
    return torch.stack(draws).to(device)


def _per_sample_loss(s: StepInputs, latents, cond, mask, keys, t, seed: int) -> torch.Tensor:
    """Each sample's mean element loss at noise level ``t`` (float32 [B])."""
    noise = validation_noise(keys, t, seed, tuple(latents.shape[1:]), latents.device)
    levels = s.objective.level_tensor([t] * len(keys), latents.device)
    noisy = s.objective.noisy(latents, noise, levels)
    # a model with experts: the one that owns the level (else the default denoiser)
    prediction = predict(
        s, noisy, levels, cond, expert_for_level(s.experts, s.objective, levels, s.device)
    )
    huber_c = None
    if s.loss.loss_type in ("huber", "smooth_l1"):
        huber_c = s.objective.huber_thresholds(s.loss, levels).to(prediction.device)
    target = s.objective.target(latents, noise, levels)
    elements = element_loss(prediction, target, s.loss.loss_type, huber_c)
    if mask is not None:
        elements = elements * mask.to(elements)
    return elements.mean(dim=tuple(range(1, elements.dim())))


def batch_validation_loss(
    s: StepInputs, batch: dict, timesteps: Sequence[int], seed: int
) -> tuple[torch.Tensor, int]:
    """(sum over the batch's samples and ``timesteps`` of each per-sample loss, number of terms).

    The sum is a float32 scalar on ``s.device``. ``batch`` is a training-loader batch plus
    "validation_keys" (one name per sample, keying its noise); samples its "readable" marks
    False (images that could not be read) are left out. Runs without gradients on the
    unwrapped modules (see _unwrapped); the result does not depend on how samples are batched.
    """
    plain = _unwrapped(s)
    if not timesteps:
        raise ConfigError("validation needs at least one timestep")
    s.objective.level_tensor(list(timesteps), s.device)  # refuses levels outside the schedule
    steps = list(timesteps)
    keys = _keys(batch, len(batch["captions"]))
    with torch.no_grad():
        mean, _ = batch_posterior(plain, batch)
        latents = plain.codec.to_latents(mean)
        cond = batch_conditioning(plain, with_image_inputs(plain, batch))
        mask = latent_mask(batch, latents.shape)
        readable = batch.get("readable", torch.ones(len(keys), dtype=torch.bool)).to(s.device)
        total = torch.zeros((), dtype=torch.float32, device=s.device)
        for t in steps:
            per_sample = _per_sample_loss(plain, latents, cond, mask, keys, t, seed)
            total = total + torch.where(readable, per_sample, 0.0).sum()
    return total, int(readable.sum().item()) * len(steps)


def validation_loss(
    s: StepInputs,
    batches: Iterable[dict],
    timesteps: Sequence[int],
    seed: int,
    reduce: Callable[[torch.Tensor], torch.Tensor] | None = None,
) -> float:
    """The mean per-sample, per-timestep validation loss over ``batches`` (this rank's share).

    With ``reduce`` (e.g. ``lambda x: accelerator.reduce(x, "sum")``) the [total, count] pair is
    summed over ranks first, so every rank returns the mean over all validation images; every
    rank must then call this, even one with no batches. ValueError when there is no sample at all.
    """
    total = torch.zeros((), dtype=torch.float32, device=s.device)
    count = 0
    for batch in batches:
        part, terms = batch_validation_loss(s, batch, timesteps, seed)
        total = total + part
        count += terms
    sums = torch.stack([total, torch.tensor(float(count), device=s.device)])
    if reduce is not None:
        sums = reduce(sums)
    total_sum, total_count = sums.tolist()
    if total_count == 0:
        raise NoValidationSamples("validation_loss got no validation samples on any process")
    return total_sum / total_count
