"""Z-Image's sampling written from the facts (library/models/families/zimage/objective.py's
docstring), for the tests that compare it with ZImagePipeline: the pipeline does the sampling
in training, so these live here."""

from __future__ import annotations

import torch

from library.training.flow_matching import shift_sigmas


def sampling_sigmas(num_steps: int, shift: float) -> torch.Tensor:
    """linspace(1, 1/N, N) in float32, statically shifted, then 0."""
    sigmas = shift_sigmas(torch.linspace(1.0, 1.0 / num_steps, num_steps), shift)
    return torch.cat([sigmas, sigmas.new_zeros(1)])


def euler_step(latents, raw, sigma, sigma_next) -> torch.Tensor:
    """x + (sigma_next - sigma) * velocity in float32, the velocity being the negated raw
    output."""
    return latents.float() + (sigma_next - sigma) * -raw.float()
