"""Per-sample randomness keyed by (seed, epoch, position), independent of batching and processes.

Every random draw of a training sample (the VAE posterior sample, the noise, the timestep, the
offset noise) comes from a generator seeded by the sample's key alone. So a sample gets the same
draws whether it is trained in a batch of 4, as one of 4 accumulated micro-batches, or on another
process: the run's result depends on which samples form each optimizer step, never on how they
are spread over micro-batches and ranks.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import torch


def sample_seed(seed: int, epoch: int, position: int) -> int:
    """A 63-bit seed mixed from the key; stable across processes and Python runs."""
    digest = hashlib.blake2b(f"{seed}:{epoch}:{position}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & ((1 << 63) - 1)


@dataclass
class SampleDraws:
    """The random inputs of one micro-batch, stacked along the batch dimension."""

    latent_eps: torch.Tensor  # standard normal, shape of the latents: samples the VAE posterior
    noise: torch.Tensor  # standard normal, shape of the latents: the diffusion noise
    timesteps: torch.Tensor  # long [B]
    offset: torch.Tensor  # standard normal [B, C, 1, 1] for noise_offset


def draw(
    seed: int,
    epoch: int,
    positions: list[int],
    latent_shape: tuple[int, int, int],
    num_timesteps: int,
    device: torch.device,
) -> SampleDraws:
    """Draw each sample's randoms on the CPU from its own generator, then move them to ``device``.

    The draw order inside one generator is fixed, so adding a new kind of draw later must append
    it at the end to keep existing runs reproducible.
    """
    eps, noise, steps, offset = [], [], [], []
    for position in positions:
        gen = torch.Generator().manual_seed(sample_seed(seed, epoch, position))
        eps.append(torch.randn(latent_shape, generator=gen))
        noise.append(torch.randn(latent_shape, generator=gen))
        steps.append(torch.randint(0, num_timesteps, (1,), generator=gen))
        offset.append(torch.randn((latent_shape[0], 1, 1), generator=gen))
    return SampleDraws(
        latent_eps=torch.stack(eps).to(device),
        noise=torch.stack(noise).to(device),
        timesteps=torch.cat(steps).to(device),
        offset=torch.stack(offset).to(device),
    )
