import torch
from diffusers import DDPMScheduler

from library.training.loss import min_snr_weight, signal_to_noise, weighted_loss


def test_weighted_loss_matches_plain_mse():
    torch.manual_seed(0)
    pred, target = torch.randn(3, 4, 5, 5), torch.randn(3, 4, 5, 5)
    weights = torch.tensor([1.0, 0.5, 2.0])
    expected = sum(
        weights[i] * torch.nn.functional.mse_loss(pred[i], target[i]) for i in range(3)
    ) / 3
    assert torch.allclose(weighted_loss(pred, target, weights, None), expected, atol=1e-6)
    snr_w = torch.tensor([0.1, 0.2, 0.3])
    expected_snr = sum(
        weights[i] * snr_w[i] * torch.nn.functional.mse_loss(pred[i], target[i]) for i in range(3)
    ) / 3
    assert torch.allclose(weighted_loss(pred, target, weights, snr_w), expected_snr, atol=1e-6)


def test_snr_and_min_snr_weights():
    sched = DDPMScheduler(beta_start=0.00085, beta_end=0.012, beta_schedule="scaled_linear")
    t = torch.tensor([0, 10, 500, 999])
    betas = torch.linspace(0.00085**0.5, 0.012**0.5, 1000, dtype=torch.float64) ** 2
    alpha_bar = torch.cumprod(1 - betas, 0)[t]
    snr = signal_to_noise(sched.alphas_cumprod, t)
    assert torch.allclose(snr.double(), alpha_bar / (1 - alpha_bar), rtol=1e-4)
    gamma = 5.0
    eps_w = min_snr_weight(snr, gamma, v_prediction=False)
    v_w = min_snr_weight(snr, gamma, v_prediction=True)
    for i, s in enumerate(snr.tolist()):
        assert abs(eps_w[i].item() - min(s, gamma) / s) < 1e-5
        assert abs(v_w[i].item() - min(s, gamma) / (s + 1)) < 1e-5
    # low-noise steps (high SNR) are down-weighted, high-noise steps keep weight 1 for epsilon
    assert eps_w[0] < 0.1 and eps_w[-1] == 1.0
