"""The diffusion training loss: element losses (l2, l1, Huber), and per-sample weights.

The SNR-based formulas here are the DDPM objective's (library.training.objectives calls them);
``diffusion_loss`` itself asks the objective for them. A sample's loss is the mean of its element losses, times its dataset weight (prior loss) and its
timestep weights (min-SNR, v-prediction scaling, debiased estimation). The batch loss is the mean
over samples, so it does not depend on how samples are grouped into micro-batches.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from library.errors import ConfigError

# SNR at t = 0 is huge (about 1/beta_0); the SNR-scaled weights cap it so weights stay finite.
SNR_CAP = 1000.0


@dataclass(frozen=True)
class LossOptions:
    """The loss keys of TrainingSection."""

    loss_type: str = "l2"
    huber_c: float = 0.1
    huber_schedule: str = "snr"
    huber_scale: float = 1.0
    min_snr_gamma: float | None = None
    scale_v_pred_loss_like_noise_pred: bool = False
    v_pred_like_loss: float = 0.0
    debiased_estimation_loss: bool = False

    @classmethod
    def from_training(cls, training: object) -> LossOptions:
        """The options of a TrainingSection (any object with these attribute names)."""
        return cls(**{name: getattr(training, name) for name in cls.__dataclass_fields__})

    def check(self, v_prediction: bool) -> None:
        """ConfigError for options that do not fit the model's prediction type."""
        if self.scale_v_pred_loss_like_noise_pred and not v_prediction:
            raise ConfigError(
                "scale_v_pred_loss_like_noise_pred is for v-prediction models and this model "
                "predicts epsilon; remove it"
            )
        if self.v_pred_like_loss and v_prediction:
            raise ConfigError(
                "v_pred_like_loss is for epsilon models and this model predicts v; remove it"
            )


def signal_to_noise(alphas_cumprod: torch.Tensor, timesteps: torch.Tensor) -> torch.Tensor:
    """SNR(t) = alpha_bar_t / (1 - alpha_bar_t) for each timestep."""
    alpha_bar = alphas_cumprod.to(timesteps.device)[timesteps].float()
    return alpha_bar / (1.0 - alpha_bar)


def min_snr_weight(snr: torch.Tensor, gamma: float, v_prediction: bool) -> torch.Tensor:
    """Min-SNR-gamma weights (Hang et al. 2023): min(SNR, gamma) / SNR for an epsilon target.

    A v target already carries a factor SNR + 1 relative to epsilon, hence the other denominator.
    """
    clipped = torch.clamp(snr, max=gamma)
    return clipped / (snr + 1.0) if v_prediction else clipped / snr


def huber_thresholds(
    options: LossOptions, timesteps: torch.Tensor, alphas_cumprod: torch.Tensor
) -> torch.Tensor:
    """The Huber threshold c_t of each sample for its timestep t (float32 [B]).

    constant: c * scale; exponential: scale * c ** (t / T), from scale at t = 0 down to
    scale * c at t = T; snr: (1 - c) / (1 + sigma_t) ** 2 + c with sigma_t = 1 / sqrt(SNR_t),
    from about 1 at low noise down to c at high noise. These are kohya's definitions, which
    leave huber_scale out of the snr schedule.
    """
    c, scale = options.huber_c, options.huber_scale
    t = timesteps.float()
    if options.huber_schedule == "constant":
        return torch.full_like(t, c * scale)
    if options.huber_schedule == "exponential":
        return scale * torch.exp(t * (math.log(c) / len(alphas_cumprod)))
    if options.huber_schedule == "snr":
        sigma = signal_to_noise(alphas_cumprod, timesteps).rsqrt()
        return (1.0 - c) / (1.0 + sigma) ** 2 + c
    raise ConfigError(
        f'huber_schedule "{options.huber_schedule}" is not one of constant, exponential, snr'
    )


def element_loss(
    prediction: torch.Tensor, target: torch.Tensor, loss_type: str, huber_c: torch.Tensor | None
) -> torch.Tensor:
    """The loss of every element, in float32; ``huber_c`` [B] is needed by huber and smooth_l1."""
    diff = prediction.float() - target.float()
    if loss_type == "l2":
        return diff.pow(2)
    if loss_type == "l1":
        return diff.abs()
    if loss_type in ("huber", "smooth_l1"):
        c = huber_c.float().view(-1, *([1] * (diff.dim() - 1)))
        # sqrt(d^2 + c^2) - c, written as d^2 / (sqrt(d^2 + c^2) + c): the same value without
        # the cancellation that loses most float32 digits when c is large beside d.
        squared = diff.pow(2)
        # (The floor keeps d = 0 at 0 where an exponential schedule's c underflows to 0.)
        denominator = (torch.sqrt(squared + c.pow(2)) + c).clamp_min(
            torch.finfo(torch.float32).tiny
        )
        smooth = squared / denominator
        return 2.0 * c * smooth if loss_type == "huber" else 2.0 * smooth
    raise ConfigError(f'loss_type "{loss_type}" is not one of l2, l1, huber, smooth_l1')


def timestep_weights(
    options: LossOptions, snr: torch.Tensor, v_prediction: bool
) -> torch.Tensor | None:
    """The product of the enabled SNR-based weights of each sample, or None when none is on."""
    weights = torch.ones_like(snr)
    capped = torch.clamp(snr, max=SNR_CAP)
    enabled = False
    if options.min_snr_gamma:
        weights = weights * min_snr_weight(snr, options.min_snr_gamma, v_prediction)
        enabled = True
    if options.scale_v_pred_loss_like_noise_pred:
        weights = weights * capped / (capped + 1.0)
        enabled = True
    if options.v_pred_like_loss:
        weights = weights * (1.0 + options.v_pred_like_loss * (capped + 1.0) / capped)
        enabled = True
    if options.debiased_estimation_loss:
        weights = weights / (capped + 1.0) if v_prediction else weights / capped.sqrt()
        enabled = True
    return weights if enabled else None


def diffusion_loss(
    prediction: torch.Tensor,
    target: torch.Tensor,
    levels: torch.Tensor,
    loss_weights: torch.Tensor,
    options: LossOptions,
    objective,
    mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """Mean over the batch of each sample's mean element loss times its weights (float32).

    ``levels`` are the samples' noise levels and ``objective`` the training objective
    (library.training.objectives) that gives their Huber thresholds and level weights (min-SNR
    and the like). ``mask`` (alpha_mask: [B, 1, h, w], or any shape that broadcasts over the
    latents, see step.latent_mask) multiplies the element losses before their mean, as kohya's
    masked loss does: a half-transparent image contributes half the loss of an opaque one.
    """
    huber_c = None
    if options.loss_type in ("huber", "smooth_l1"):
        huber_c = objective.huber_thresholds(options, levels).to(prediction.device)
    elements = element_loss(prediction, target, options.loss_type, huber_c)
    if mask is not None:
        elements = elements * mask.to(elements)
    per_sample = elements.mean(dim=tuple(range(1, elements.dim())))
    per_sample = per_sample * loss_weights.to(per_sample)
    weights = objective.level_weights(options, levels)
    if weights is not None:
        per_sample = per_sample * weights.to(per_sample)
    return per_sample.mean()
