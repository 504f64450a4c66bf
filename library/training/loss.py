"""The diffusion training loss: target, per-sample MSE and its weights (prior loss, min-SNR)."""

from __future__ import annotations

import torch


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


def weighted_loss(
    prediction: torch.Tensor,
    target: torch.Tensor,
    loss_weights: torch.Tensor,
    snr_weights: torch.Tensor | None,
) -> torch.Tensor:
    """Mean over the batch of per-sample MSE times its weights, computed in float32."""
    per_sample = (prediction.float() - target.float()).pow(2).mean(dim=(1, 2, 3))
    per_sample = per_sample * loss_weights.to(per_sample)
    if snr_weights is not None:
        per_sample = per_sample * snr_weights.to(per_sample)
    return per_sample.mean()
