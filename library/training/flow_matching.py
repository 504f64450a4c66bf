"""Rectified-flow (flow-matching) math for Flux.1 and SD3.x training, in kohya-ss sd-scripts' terms.

Conventions (the same as kohya-ss sd-scripts and diffusers):

* ``sigma`` in [0, 1] is the noise level: ``x_t = (1 - sigma) * x0 + sigma * noise``, so sigma 0
  is the clean latent and sigma 1 is pure noise.
* The network predicts the velocity ``d x_t / d sigma = noise - x0``.
* "timesteps" are ``sigma * 1000`` (1000 = the schedulers' ``num_train_timesteps``).

Nothing here draws random numbers. The trainer draws, for every sample, one standard-normal
value ``z`` and one uniform [0, 1) value ``u`` from that sample's own generator, and the functions
below map them deterministically. Which of the two a setting consumes:

* ``uniform``: ``u``.
* ``sigmoid``, ``shift``, ``flux_shift``, ``qwen_shift``: ``z``.
* ``sigma`` (and SD3's sampler): ``z`` when ``weighting_scheme`` is ``logit_normal``, else ``u``.

Drawing both values for every sample, whatever the options, keeps the later draws of a sample's
stream where they are when an option changes.
"""

from __future__ import annotations

import math
import numbers
from typing import NamedTuple

import torch

from library.errors import ConfigError

NUM_TRAIN_TIMESTEPS = 1000

TIMESTEP_SAMPLINGS = ("sigma", "uniform", "sigmoid", "shift", "flux_shift", "qwen_shift")
# The draws that shift sigmoid(sigmoid_scale * z): by discrete_flow_shift, or by the image size
SIGMOID_SAMPLINGS = ("sigmoid", "shift", "flux_shift", "qwen_shift")
WEIGHTING_SCHEMES = ("sigma_sqrt", "logit_normal", "mode", "cosmap", "none", "uniform")
MODEL_PREDICTION_TYPES = ("raw", "additive", "sigma_scaled")

# Flux.1's resolution-dependent shift: mu is linear in the packed image's token count, through
# these two points (the values of black-forest-labs' reference code and of the Flux scheduler
# configs on the Hub).
FLUX_BASE_SEQ_LEN = 256
FLUX_MAX_SEQ_LEN = 4096
FLUX_BASE_SHIFT = 0.5
FLUX_MAX_SHIFT = 1.15
# Qwen-Image's line (its released scheduler config's base/max_image_seq_len and base/max_shift,
# which QwenImagePipeline's calculate_shift reads; musubi-tuner's qwen_shift draws with it)
QWEN_BASE_SEQ_LEN = 256
QWEN_MAX_SEQ_LEN = 8192
QWEN_BASE_SHIFT = 0.5
QWEN_MAX_SHIFT = 0.9

# The SD3 paper's mode density f(u) = 1 - u - s * (cos^2(pi u / 2) - 1 + u) maps [0, 1] onto [0, 1]
# monotonically only for -1 <= s <= 2 / (pi - 2); outside it f leaves [0, 1] or folds back.
MODE_SCALE_MIN = -1.0
MODE_SCALE_MAX = 2.0 / (math.pi - 2.0)


class FlowMatchingConfigError(ConfigError, ValueError):
    """An impossible flow-matching option; a ConfigError (printed as one line) and a ValueError."""


class FlowTimesteps(NamedTuple):
    """Per-sample noise levels [B] and the timesteps [B] the trainer logs and feeds the model."""

    sigmas: torch.Tensor
    timesteps: torch.Tensor


class FlowPrediction(NamedTuple):
    """The prediction to compare with the target, and the per-sample loss weight [B] (or None)."""

    prediction: torch.Tensor
    weighting: torch.Tensor | None


# ---------------------------------------------------------------------------------------------
# validation


def _fail(key: str, value: object, need: str) -> None:
    raise FlowMatchingConfigError(f"{key} = {value!r} is not allowed: {need}")


def _check_choice(key: str, value: str, choices: tuple[str, ...]) -> None:
    if value not in choices:
        _fail(key, value, "use one of " + ", ".join(choices))


def _is_number(value: object) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def _check_positive(key: str, value: float) -> None:
    if not (_is_number(value) and math.isfinite(value) and value > 0):
        _fail(key, value, "it must be a finite number > 0")


def validate_flow_options(
    *,
    timestep_sampling: str | None = None,
    sigmoid_scale: float | None = None,
    discrete_flow_shift: float | None = None,
    weighting_scheme: str | None = None,
    logit_mean: float | None = None,
    logit_std: float | None = None,
    mode_scale: float | None = None,
    model_prediction_type: str | None = None,
    training_shift: float | None = None,
    min_timestep: int | None = None,
    max_timestep: int | None = None,
) -> None:
    """Raise FlowMatchingConfigError (one line, naming the key) for an impossible value.

    Only the keys given (not None) are checked. ``min_timestep``/``max_timestep`` follow kohya's
    SD3 sampler: 0 <= min_timestep <= max_timestep <= 1000.
    """
    if timestep_sampling is not None:
        _check_choice("timestep_sampling", timestep_sampling, TIMESTEP_SAMPLINGS)
    if weighting_scheme is not None:
        _check_choice("weighting_scheme", weighting_scheme, WEIGHTING_SCHEMES)
    if model_prediction_type is not None:
        _check_choice("model_prediction_type", model_prediction_type, MODEL_PREDICTION_TYPES)
    if sigmoid_scale is not None:
        _check_positive("sigmoid_scale", sigmoid_scale)
    if discrete_flow_shift is not None:
        _check_positive("discrete_flow_shift", discrete_flow_shift)
    if training_shift is not None:
        _check_positive("training_shift", training_shift)
    if logit_std is not None:
        _check_positive("logit_std", logit_std)
    if logit_mean is not None and not (_is_number(logit_mean) and math.isfinite(logit_mean)):
        _fail("logit_mean", logit_mean, "it must be a finite number")
    if mode_scale is not None and not (
        _is_number(mode_scale) and MODE_SCALE_MIN <= mode_scale <= MODE_SCALE_MAX
    ):
        _fail(
            "mode_scale",
            mode_scale,
            f"it must lie in [{MODE_SCALE_MIN:g}, {MODE_SCALE_MAX:.4f}] (2/(pi-2)) for the mode "
            "density to map [0, 1] onto [0, 1]",
        )
    low = 0 if min_timestep is None else min_timestep
    high = NUM_TRAIN_TIMESTEPS if max_timestep is None else max_timestep
    if min_timestep is not None and not 0 <= min_timestep <= NUM_TRAIN_TIMESTEPS:
        _fail("min_timestep", min_timestep, f"it must lie in [0, {NUM_TRAIN_TIMESTEPS}]")
    if max_timestep is not None and not 0 <= max_timestep <= NUM_TRAIN_TIMESTEPS:
        _fail("max_timestep", max_timestep, f"it must lie in [0, {NUM_TRAIN_TIMESTEPS}]")
    if low > high:
        _fail("min_timestep", min_timestep, f"it must not exceed max_timestep = {high}")


# ---------------------------------------------------------------------------------------------
# sigma maps


def density_u(
    weighting_scheme: str,
    z: torch.Tensor,
    u: torch.Tensor,
    *,
    logit_mean: float = 0.0,
    logit_std: float = 1.0,
    mode_scale: float = 1.29,
) -> torch.Tensor:
    """The SD3 paper's timestep density as a map of the draws: a value in [0, 1] per sample.

    ``logit_normal``: sigmoid(logit_mean + logit_std * z) (consumes z). ``mode``:
    1 - u - mode_scale * (cos^2(pi u / 2) - 1 + u) (consumes u). Every other scheme: u itself.
    """
    validate_flow_options(weighting_scheme=weighting_scheme)
    if weighting_scheme == "logit_normal":
        validate_flow_options(logit_mean=logit_mean, logit_std=logit_std)
        return torch.sigmoid(logit_mean + logit_std * z)
    if weighting_scheme == "mode":
        validate_flow_options(mode_scale=mode_scale)
        mapped = 1 - u - mode_scale * (torch.cos(math.pi * u / 2) ** 2 - 1 + u)
        # Exact arithmetic keeps this in [0, 1]; the clamp only removes rounding spill-over.
        return mapped.clamp(0.0, 1.0)
    return u.clone()


def shift_sigmas(sigmas: torch.Tensor, shift: float) -> torch.Tensor:
    """The discrete-flow shift s' = shift * s / (1 + (shift - 1) * s); shift > 1 moves toward noise."""
    return shift * sigmas / (1 + (shift - 1) * sigmas)


def time_shift_sigmas(sigmas: torch.Tensor, mu: float) -> torch.Tensor:
    """Flux's time shift exp(mu) / (exp(mu) + (1/s - 1)); the same map as shift_sigmas(s, exp(mu))."""
    e = math.exp(mu)
    return e / (e + (1 / sigmas - 1))


def flux_mu(
    image_seq_len: float,
    *,
    base_seq_len: int = FLUX_BASE_SEQ_LEN,
    max_seq_len: int = FLUX_MAX_SEQ_LEN,
    base_shift: float = FLUX_BASE_SHIFT,
    max_shift: float = FLUX_MAX_SHIFT,
) -> float:
    """mu for Flux's time shift: the line through (base_seq_len, base_shift), (max_seq_len, max_shift)."""
    slope = (max_shift - base_shift) / (max_seq_len - base_seq_len)
    return base_shift + slope * (image_seq_len - base_seq_len)


def qwen_mu(image_seq_len: float) -> float:
    """mu for Qwen-Image's time shift: the line through (256, 0.5) and (8192, 0.9)."""
    return flux_mu(
        image_seq_len,
        base_seq_len=QWEN_BASE_SEQ_LEN,
        max_seq_len=QWEN_MAX_SEQ_LEN,
        base_shift=QWEN_BASE_SHIFT,
        max_shift=QWEN_MAX_SHIFT,
    )


def image_seq_len(latent_height: int, latent_width: int, patch: int) -> int:
    """Image tokens of latents whose denoiser makes one token of each ``patch`` x ``patch``
    square: (h // patch) * (w // patch) (4096 for 128x128 latents in 2x2 patches, a 1024 px
    image of an 8x VAE)."""
    return (latent_height // patch) * (latent_width // patch)


def training_schedule_sigmas(
    shift: float, num_train_timesteps: int = NUM_TRAIN_TIMESTEPS
) -> torch.Tensor:
    """The training scheduler's sigma table [num_train_timesteps], descending from 1.

    Entry k is shift_sigmas((N - k) / N, shift): what FlowMatchEulerDiscreteScheduler(shift=...)
    holds as ``sigmas`` before set_timesteps. The smallest entry is shift_sigmas(1/N) > 0.
    """
    base = torch.arange(num_train_timesteps, 0, -1, dtype=torch.float32) / num_train_timesteps
    return shift_sigmas(base, shift)


# The draws shifted by the image's size -> their mu
_SIZE_SHIFTS = {"flux_shift": flux_mu, "qwen_shift": qwen_mu}


def _check_draws(z: torch.Tensor, u: torch.Tensor) -> None:
    if z.shape != u.shape or z.dim() != 1:
        raise ValueError(
            f"z and u must both have shape [B]; got {tuple(z.shape)} and {tuple(u.shape)}"
        )


def flux_sample_sigmas(
    z: torch.Tensor,
    u: torch.Tensor,
    *,
    timestep_sampling: str = "sigma",
    sigmoid_scale: float = 1.0,
    discrete_flow_shift: float = 3.0,
    image_seq_len: int | None = None,
    weighting_scheme: str = "uniform",
    logit_mean: float = 0.0,
    logit_std: float = 1.0,
    mode_scale: float = 1.29,
) -> FlowTimesteps:
    """Each sample's sigma and timestep for kohya's Flux ``timestep_sampling`` (defaults = kohya's).

    ``uniform``: u. ``sigmoid``: sigmoid(sigmoid_scale * z). ``shift``: that, then
    shift_sigmas(., discrete_flow_shift). ``flux_shift``: sigmoid(sigmoid_scale * z), then
    time_shift_sigmas(., flux_mu(image_seq_len)); ``qwen_shift`` the same with
    qwen_mu(image_seq_len) (musubi-tuner's Qwen-Image draw). ``sigma``: density_u(weighting_scheme) picks index
    floor(1000 * u) of training_schedule_sigmas(discrete_flow_shift), a table that descends, so a
    large u gives a small sigma. The timestep is sigma * 1000 in every case.
    """
    _check_draws(z, u)
    validate_flow_options(timestep_sampling=timestep_sampling)
    if timestep_sampling == "uniform":
        sigmas = u.clone()
    elif timestep_sampling in SIGMOID_SAMPLINGS:
        validate_flow_options(sigmoid_scale=sigmoid_scale)
        sigmas = torch.sigmoid(sigmoid_scale * z)
        if timestep_sampling == "shift":
            validate_flow_options(discrete_flow_shift=discrete_flow_shift)
            sigmas = shift_sigmas(sigmas, discrete_flow_shift)
        elif timestep_sampling in _SIZE_SHIFTS:
            if image_seq_len is None:
                raise ValueError(
                    f"timestep_sampling = '{timestep_sampling}' needs the image's image_seq_len"
                )
            sigmas = time_shift_sigmas(sigmas, _SIZE_SHIFTS[timestep_sampling](image_seq_len))
    else:
        validate_flow_options(discrete_flow_shift=discrete_flow_shift)
        density = density_u(
            weighting_scheme,
            z,
            u,
            logit_mean=logit_mean,
            logit_std=logit_std,
            mode_scale=mode_scale,
        )
        table = training_schedule_sigmas(discrete_flow_shift).to(device=u.device, dtype=u.dtype)
        # A density value of exactly 1 (sigmoid saturation, or mode at u = 0) would index one past
        # the table; kohya raises IndexError there, we take the last entry.
        index = (density * NUM_TRAIN_TIMESTEPS).floor().long().clamp(0, NUM_TRAIN_TIMESTEPS - 1)
        sigmas = table[index]
    return FlowTimesteps(sigmas, sigma_to_timestep(sigmas))


def sd3_sample_sigmas(
    z: torch.Tensor,
    u: torch.Tensor,
    *,
    weighting_scheme: str = "uniform",
    logit_mean: float = 0.0,
    logit_std: float = 1.0,
    mode_scale: float = 1.29,
    training_shift: float = 1.0,
    min_timestep: int | None = None,
    max_timestep: int | None = None,
) -> FlowTimesteps:
    """Each sample's sigma and integer-valued timestep as kohya's SD3 trainer draws them.

    v = shift_sigmas(density_u(...), training_shift); timestep = floor(v * (max - min) + min)
    with min/max defaulting to 0/1000; sigma = timestep / 1000. Unlike Flux's ``sigma`` sampling,
    sigma grows with the density value, and sigma 0 is reachable when min_timestep is 0.
    """
    _check_draws(z, u)
    validate_flow_options(
        training_shift=training_shift, min_timestep=min_timestep, max_timestep=max_timestep
    )
    low = 0 if min_timestep is None else min_timestep
    high = NUM_TRAIN_TIMESTEPS if max_timestep is None else max_timestep
    density = density_u(
        weighting_scheme, z, u, logit_mean=logit_mean, logit_std=logit_std, mode_scale=mode_scale
    )
    shifted = shift_sigmas(density, training_shift)
    timesteps = (shifted * (high - low) + low).floor()
    return FlowTimesteps(timesteps / NUM_TRAIN_TIMESTEPS, timesteps)


# ---------------------------------------------------------------------------------------------
# timesteps for the models


def sigma_to_timestep(
    sigmas: torch.Tensor, num_train_timesteps: int = NUM_TRAIN_TIMESTEPS
) -> torch.Tensor:
    """sigma * 1000: kohya's "timesteps", and the timestep SD3's MMDiT takes (kohya and diffusers)."""
    return sigmas * num_train_timesteps


def flux_model_timestep(
    timesteps: torch.Tensor, num_train_timesteps: int = NUM_TRAIN_TIMESTEPS
) -> torch.Tensor:
    """timesteps / 1000 (= sigma): what the Flux transformer takes; it multiplies by 1000 inside.

    Holds for kohya's flux_models.Flux (timestep_embedding's time_factor 1000) and diffusers'
    FluxTransformer2DModel. Keep this in float32: kohya casts timesteps to the weight dtype
    first, which in bf16 rounds sigma * 1000 to steps of up to 4.
    """
    return timesteps / num_train_timesteps


# ---------------------------------------------------------------------------------------------
# noising, target, prediction, weighting


def _per_sample(values: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    return values.reshape(values.shape[0], *([1] * (like.dim() - 1))).to(like.dtype)


def noisy_latents(x0: torch.Tensor, noise: torch.Tensor, sigmas: torch.Tensor) -> torch.Tensor:
    """x_t = (1 - sigma) * x0 + sigma * noise, sigma [B] broadcast over the non-batch dims.

    With input perturbation (ip_noise_gamma), kohya's Flux trainer passes noise + gamma * xi here
    and keeps the unperturbed noise in the target.
    """
    s = _per_sample(sigmas, x0)
    return (1.0 - s) * x0 + s * noise


def velocity_target(x0: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
    """noise - x0: d x_t / d sigma, the target kohya's Flux trainer uses for every prediction type."""
    return noise - x0


def loss_weighting(weighting_scheme: str, sigmas: torch.Tensor) -> torch.Tensor:
    """Per-sample SD3 loss weight [B]: sigma_sqrt -> sigma**-2, cosmap -> 2 / (pi (1 - 2s + 2s^2)), else 1.

    sigma_sqrt is infinite at sigma 0.
    """
    validate_flow_options(weighting_scheme=weighting_scheme)
    s = sigmas if sigmas.dtype in (torch.float32, torch.float64) else sigmas.float()
    if weighting_scheme == "sigma_sqrt":
        return s**-2.0
    if weighting_scheme == "cosmap":
        return 2 / (math.pi * (1 - 2 * s + 2 * s**2))
    return torch.ones_like(s)


def output_loss_weights(weighting_scheme: str, sigmas: torch.Tensor) -> torch.Tensor | None:
    """musubi-tuner's per-sample loss weight of a raw-output loss [B]: loss_weighting's for
    sigma_sqrt and cosmap (sigma_sqrt's infinite weight at sigma 0, where the loss is 0
    anyway, becomes 0), None for every other scheme."""
    if weighting_scheme not in ("sigma_sqrt", "cosmap"):
        return None
    weights = loss_weighting(weighting_scheme, sigmas)
    return torch.where(torch.isinf(weights), torch.zeros_like(weights), weights)


def apply_model_prediction_type(
    model_output: torch.Tensor,
    noisy: torch.Tensor,
    sigmas: torch.Tensor,
    model_prediction_type: str,
    weighting_scheme: str = "uniform",
) -> FlowPrediction:
    """Turn the raw network output into the prediction compared with the target (kohya's Flux).

    ``raw``: the output, no weighting. ``additive``: output + x_t, no weighting. ``sigma_scaled``:
    x_t - sigma * output (an x0 estimate when the output is the velocity) with
    loss_weighting(weighting_scheme, sigmas). kohya's SD3 trainer always uses the sigma_scaled
    form, with x0 as target.
    """
    validate_flow_options(model_prediction_type=model_prediction_type)
    if model_prediction_type == "raw":
        return FlowPrediction(model_output, None)
    if model_prediction_type == "additive":
        return FlowPrediction(model_output + noisy, None)
    prediction = noisy - _per_sample(sigmas, model_output) * model_output
    return FlowPrediction(prediction, loss_weighting(weighting_scheme, sigmas))


# ---------------------------------------------------------------------------------------------
# sampling


def flux_sampling_sigmas(num_steps: int, mu: float | None = None) -> torch.Tensor:
    """Flux sampler sigmas [num_steps + 1]: linspace(1, 1/N, N), time-shifted by mu, then 0.

    Pass mu = flux_mu(image_seq_len) for Flux.1 dev; mu None (no shift) is Flux.1 schnell in
    diffusers. Matches diffusers' FluxPipeline with its FlowMatchEulerDiscreteScheduler.
    """
    if num_steps < 1:
        raise ValueError(f"num_steps = {num_steps} must be >= 1")
    sigmas = torch.linspace(1.0, 1.0 / num_steps, num_steps, dtype=torch.float64)
    if mu is not None:
        sigmas = time_shift_sigmas(sigmas, mu)
    return torch.cat([sigmas, sigmas.new_zeros(1)]).float()


def sd3_sampling_sigmas(
    num_steps: int, shift: float = 3.0, num_train_timesteps: int = NUM_TRAIN_TIMESTEPS
) -> torch.Tensor:
    """SD3 sampler sigmas [num_steps + 1], as diffusers' SD3 pipeline (and kohya's scheduler) set them.

    linspace from 1 to the training table's last sigma shift_sigmas(1/N), shifted again by
    ``shift`` (so the low end is shifted twice, as those schedulers do), then 0.
    """
    if num_steps < 1:
        raise ValueError(f"num_steps = {num_steps} must be >= 1")
    _check_positive("shift", shift)
    lowest = shift * (1 / num_train_timesteps) / (1 + (shift - 1) / num_train_timesteps)
    sigmas = shift_sigmas(torch.linspace(1.0, lowest, num_steps, dtype=torch.float64), shift)
    return torch.cat([sigmas, sigmas.new_zeros(1)]).float()


def euler_step(
    x: torch.Tensor, velocity: torch.Tensor, sigma: float, sigma_next: float
) -> torch.Tensor:
    """One flow-matching Euler step: x + (sigma_next - sigma) * velocity."""
    return x + (sigma_next - sigma) * velocity
