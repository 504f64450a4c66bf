"""Z-Image's flow-matching objective and sampling step, in the model's own conventions.

The facts (diffusers 0.42.1 ZImagePipeline with FlowMatchEulerDiscreteScheduler):

- Noise level sigma in [0, 1]: x_t = (1 - sigma) * x0 + sigma * noise (sigma 1 = pure noise).
- The scheduler's timesteps are sigma * 1000; the pipeline feeds the transformer
  (1000 - timestep) / 1000 = **1 - sigma**, so the model sees 0 at pure noise and 1 at the clean
  image (the reverse of FLUX.1's sigma).
- The pipeline negates the output before ``scheduler.step``, whose Euler update is
  x_next = x_t + (sigma_next - sigma) * v. For that to follow the straight path, v must be the
  velocity d x_t / d sigma = noise - x0, so the transformer's **raw output is x0 - noise**: the
  training target in the model's output space (musubi-tuner trains on latents - noise with the
  raw output; ai-toolkit negates the output and trains on noise - latents: the same objective).
- Sampling sigmas: linspace(1, 1/N, N), then the scheduler's static shift
  s' = shift * s / (1 + (shift - 1) * s) (3.0 for Turbo, 6.0 for Base), then 0 appended. The
  pipeline's calculate_shift ``mu`` is ignored, the released schedulers having
  use_dynamic_shifting false.
- Training sigmas: neither release documents its training distribution. musubi-tuner's Z-Image
  guide suggests ``timestep_sampling shift``, ``discrete_flow_shift 2.0``, ``weighting_scheme
  none`` (sigma = shift(sigmoid(z)), z standard normal); ai-toolkit's Z-Image examples draw from
  its flow-matching scheduler with the Turbo shift 3.0 and ``timestep_type weighted``. The
  defaults here are musubi-tuner's, through the trainer's shared sigma sampler.
"""

from __future__ import annotations

import torch

from library.training.flow_matching import FlowTimesteps, flux_sample_sigmas, shift_sigmas

NUM_TRAIN_TIMESTEPS = 1000
# musubi-tuner's suggested Z-Image training draw (docs/zimage.md), in the [flow] option names
DEFAULT_SIGMA_SAMPLING = {
    "timestep_sampling": "shift",
    "sigmoid_scale": 1.0,
    "discrete_flow_shift": 2.0,
    "weighting_scheme": "none",
}


def sample_sigmas(z: torch.Tensor, u: torch.Tensor, **options) -> FlowTimesteps:
    """Each sample's sigma and timestep (sigma * 1000) from its standard-normal draw ``z`` and
    uniform draw ``u`` [B]: DEFAULT_SIGMA_SAMPLING with ``options`` (flow_matching's
    flux_sample_sigmas keywords) on top."""
    return flux_sample_sigmas(z, u, **{**DEFAULT_SIGMA_SAMPLING, **options})


def noisy_latents(x0: torch.Tensor, noise: torch.Tensor, sigmas: torch.Tensor) -> torch.Tensor:
    """x_t = (1 - sigma) * x0 + sigma * noise, sigma [B] broadcast over the other dims."""
    s = sigmas.reshape(-1, *([1] * (x0.dim() - 1))).to(x0.dtype)
    return (1.0 - s) * x0 + s * noise


def model_timestep(sigmas: torch.Tensor) -> torch.Tensor:
    """The transformer's timestep input for noise levels ``sigmas``: 1 - sigma, computed as the
    pipeline does from timesteps (1000 - 1000 * sigma) / 1000, so it matches it bit for bit."""
    timesteps = sigmas * NUM_TRAIN_TIMESTEPS
    return (NUM_TRAIN_TIMESTEPS - timesteps) / NUM_TRAIN_TIMESTEPS


def training_target(x0: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
    """What the raw transformer output is trained toward: x0 - noise (the negated velocity)."""
    return x0 - noise


def velocity(model_output: torch.Tensor) -> torch.Tensor:
    """d x_t / d sigma from the raw output: its negation (the pipeline's noise_pred)."""
    return -model_output


def denoised(noisy: torch.Tensor, model_output: torch.Tensor, sigmas: torch.Tensor) -> torch.Tensor:
    """The clean-latent estimate x0 = x_t - sigma * v = x_t + sigma * raw output."""
    s = sigmas.reshape(-1, *([1] * (noisy.dim() - 1))).to(model_output.dtype)
    return noisy + s * model_output


def sampling_sigmas(num_steps: int, shift: float) -> torch.Tensor:
    """The pipeline's default sigmas [num_steps + 1] for a static ``shift``: linspace(1, 1/N, N)
    in float32, shifted, then 0 (FlowMatchEulerDiscreteScheduler.set_timesteps(sigmas=...))."""
    if num_steps < 1:
        raise ValueError(f"num_steps = {num_steps} must be >= 1")
    sigmas = shift_sigmas(torch.linspace(1.0, 1.0 / num_steps, num_steps), shift)
    return torch.cat([sigmas, sigmas.new_zeros(1)])


def euler_step(
    latents: torch.Tensor, model_output: torch.Tensor, sigma: torch.Tensor, sigma_next: torch.Tensor
) -> torch.Tensor:
    """One sampling step from ``sigma`` to ``sigma_next`` (scalars) given the raw output:
    x + (sigma_next - sigma) * velocity, in float32 as the scheduler computes it."""
    return latents.float() + (sigma_next - sigma) * velocity(model_output.float())
