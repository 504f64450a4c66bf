"""Loss types, Huber schedules and SNR weights against formulas written out by hand."""

import math
from decimal import Decimal, localcontext

import pytest
import torch
from diffusers import DDPMScheduler

from library.errors import ConfigError
from library.training.loss import (
    LossOptions,
    diffusion_loss,
    element_loss,
    huber_thresholds,
    min_snr_weight,
    signal_to_noise,
)
from library.training.objectives import DDPMObjective

T = 1000


def _alpha_bar() -> torch.Tensor:
    """SD's scaled-linear schedule in float64, independently of diffusers."""
    betas = torch.linspace(0.00085**0.5, 0.012**0.5, T, dtype=torch.float64) ** 2
    return torch.cumprod(1 - betas, 0)


def _sched_alphas() -> torch.Tensor:
    return _scheduler().alphas_cumprod


def _scheduler() -> DDPMScheduler:
    return DDPMScheduler(beta_start=0.00085, beta_end=0.012, beta_schedule="scaled_linear")


def _ddpm(v_prediction: bool = False, scheduler=None) -> DDPMObjective:
    return DDPMObjective(scheduler or _scheduler(), v_prediction)


def _batch():
    torch.manual_seed(0)
    pred, target = torch.randn(3, 4, 5, 5), torch.randn(3, 4, 5, 5)
    return pred, target, torch.tensor([0, 500, 999]), torch.tensor([1.0, 0.5, 2.0])


def _per_element(a: float, b: float, kind: str, c: float) -> float:
    d = a - b
    if kind == "l2":
        return d * d
    if kind == "l1":
        return abs(d)
    pseudo = math.sqrt(d * d + c * c) - c
    return 2 * c * pseudo if kind == "huber" else 2 * pseudo


def _hand_loss(pred, target, weights, kind, cs):
    """Elementwise Python loops: mean over elements, times weight, mean over samples."""
    total = 0.0
    for i in range(pred.shape[0]):
        p, t = pred[i].flatten().tolist(), target[i].flatten().tolist()
        vals = [_per_element(a, b, kind, cs[i]) for a, b in zip(p, t, strict=True)]
        total += weights[i] * sum(vals) / len(vals)
    return total / pred.shape[0]


@pytest.mark.parametrize("kind", ["l2", "l1", "huber", "smooth_l1"])
def test_each_loss_type_matches_its_formula(kind):
    pred, target, steps, weights = _batch()
    opts = LossOptions(loss_type=kind, huber_schedule="constant", huber_c=0.3)
    ours = diffusion_loss(pred, target, steps, weights, opts, _ddpm())
    expected = _hand_loss(pred, target, weights.tolist(), kind, [0.3] * 3)
    assert abs(ours.item() - expected) < 1e-5 * max(1.0, abs(expected))


def test_l2_is_plain_mse_and_huber_tends_to_it():
    pred, target, steps, weights = _batch()
    ones = torch.ones(3)
    l2 = diffusion_loss(pred, target, steps, ones, LossOptions(), _ddpm())
    assert torch.allclose(l2, torch.nn.functional.mse_loss(pred, target), atol=1e-6)
    # smooth_l1 with a large c is about (d^2 / c): scaled by c it approaches l2
    big = LossOptions(loss_type="huber", huber_schedule="constant", huber_c=1e3)
    huber = diffusion_loss(pred, target, steps, ones, big, _ddpm())
    assert torch.allclose(huber, l2, rtol=1e-3)


def test_huber_schedules_match_formulas():
    alpha_bar = _alpha_bar()
    t = torch.tensor([0, 1, 250, 500, 999])
    c, scale = 0.2, 1.5
    const = huber_thresholds(
        LossOptions(huber_schedule="constant", huber_c=c, huber_scale=scale), t, _sched_alphas()
    )
    expo = huber_thresholds(
        LossOptions(huber_schedule="exponential", huber_c=c, huber_scale=scale), t, _sched_alphas()
    )
    snr = huber_thresholds(
        LossOptions(huber_schedule="snr", huber_c=c, huber_scale=scale), t, _sched_alphas()
    )
    for i, step in enumerate(t.tolist()):
        assert abs(const[i].item() - c * scale) < 1e-6
        alpha = -math.log(c) / T
        assert abs(expo[i].item() - scale * math.exp(-alpha * step)) < 1e-5
        sigma = math.sqrt((1 - alpha_bar[step].item()) / alpha_bar[step].item())
        assert abs(snr[i].item() - ((1 - c) / (1 + sigma) ** 2 + c)) < 1e-4
    assert expo[0].item() == pytest.approx(scale) and expo[-1].item() == pytest.approx(
        scale * c ** (999 / 1000), rel=1e-5
    )


def test_snr_huber_uses_each_samples_own_threshold():
    pred, target, steps, weights = _batch()
    opts = LossOptions(loss_type="huber", huber_schedule="snr", huber_c=0.1)
    ours = diffusion_loss(pred, target, steps, weights, opts, _ddpm())
    alpha_bar = _alpha_bar()
    cs = []
    for step in steps.tolist():
        sigma = math.sqrt((1 - alpha_bar[step].item()) / alpha_bar[step].item())
        cs.append((1 - 0.1) / (1 + sigma) ** 2 + 0.1)
    expected = _hand_loss(pred, target, weights.tolist(), "huber", cs)
    assert abs(ours.item() - expected) < 1e-4 * abs(expected)


def _snr(step: int) -> float:
    a = _alpha_bar()[step].item()
    return a / (1 - a)


def _capped(step: int) -> float:
    return min(_snr(step), 1000.0)


def _debias(step: int, v: bool) -> float:
    return 1 / (_capped(step) + 1) if v else _capped(step) ** -0.5


def _min_snr(step: int, v: bool, gamma: float = 5.0) -> float:
    return min(_snr(step), gamma) / (_snr(step) + (1 if v else 0))


def _scale_v(step: int) -> float:
    return _capped(step) / (_capped(step) + 1)


@pytest.mark.parametrize("v", [False, True])
def test_snr_weights_match_formulas(v):
    pred, target, steps, weights = _batch()
    per_sample = [((pred[i] - target[i]) ** 2).mean().item() for i in range(3)]

    def ours(**kw):
        opts = LossOptions(**kw)
        return diffusion_loss(pred, target, steps, weights, opts, _ddpm(v)).item()

    def expected(weight_of):
        terms = [
            w * ps * weight_of(s)
            for w, ps, s in zip(weights.tolist(), per_sample, steps.tolist(), strict=True)
        ]
        return pytest.approx(sum(terms) / 3, rel=1e-4)

    assert ours(debiased_estimation_loss=True) == expected(lambda s: _debias(s, v))
    assert ours(min_snr_gamma=5.0) == expected(lambda s: _min_snr(s, v))
    if v:
        assert ours(scale_v_pred_loss_like_noise_pred=True) == expected(_scale_v)
        all_three = ours(
            scale_v_pred_loss_like_noise_pred=True, min_snr_gamma=5.0, debiased_estimation_loss=True
        )
        assert all_three == expected(lambda s: _scale_v(s) * _min_snr(s, v) * _debias(s, v))
    else:
        assert ours(v_pred_like_loss=0.2) == expected(lambda s: 1 + 0.2 / _scale_v(s))


def test_snr_and_min_snr_weights():
    t = torch.tensor([0, 10, 500, 999])
    alpha_bar = _alpha_bar()[t]
    snr = signal_to_noise(_sched_alphas(), t)
    assert torch.allclose(snr.double(), alpha_bar / (1 - alpha_bar), rtol=1e-4)
    gamma = 5.0
    eps_w = min_snr_weight(snr, gamma, v_prediction=False)
    v_w = min_snr_weight(snr, gamma, v_prediction=True)
    for i, s in enumerate(snr.tolist()):
        assert abs(eps_w[i].item() - min(s, gamma) / s) < 1e-5
        assert abs(v_w[i].item() - min(s, gamma) / (s + 1)) < 1e-5
    # low-noise steps (high SNR) are down-weighted, high-noise steps keep weight 1 for epsilon
    assert eps_w[0] < 0.1 and eps_w[-1] == 1.0


def test_options_that_do_not_fit_the_model_are_errors():
    with pytest.raises(ConfigError, match="scale_v_pred_loss_like_noise_pred is for v-pred"):
        LossOptions(scale_v_pred_loss_like_noise_pred=True).check(v_prediction=False)
    with pytest.raises(ConfigError, match="v_pred_like_loss is for epsilon"):
        LossOptions(v_pred_like_loss=0.1).check(v_prediction=True)
    LossOptions(scale_v_pred_loss_like_noise_pred=True).check(v_prediction=True)


def test_alpha_mask_weights_each_latent_pixel():
    from library.training.step import latent_mask

    torch.manual_seed(0)
    prediction, target = torch.randn(2, 4, 4, 4), torch.randn(2, 4, 4, 4)
    # pixel-space masks 32x32: sample 0 has its left half transparent, sample 1 is opaque
    masks = torch.ones(2, 1, 32, 32)
    masks[0, :, :, :16] = 0.0
    masks[0, :, :4, 16:] = 0.5  # half-transparent over 4 of the 8 pixel rows of latent row 0
    mask = latent_mask({"alpha_masks": masks}, prediction.shape)
    expected_mask = torch.ones(2, 1, 4, 4)
    expected_mask[0, :, :, :2] = 0.0
    expected_mask[0, :, 0, 2:] = 0.75  # the mean of 4 rows at 0.5 and 4 at 1
    assert torch.equal(mask, expected_mask)
    timesteps = torch.tensor([10, 500])
    objective = DDPMObjective(DDPMScheduler(), False)
    loss = diffusion_loss(
        prediction, target, timesteps, torch.ones(2), LossOptions(), objective, mask
    )
    # by hand: squared error times the mask, mean over each sample's elements, mean over samples
    per_sample = ((prediction - target) ** 2 * expected_mask).mean(dim=(1, 2, 3))
    assert loss.item() == pytest.approx(per_sample.mean().item(), rel=1e-6)
    unmasked = diffusion_loss(
        prediction, target, timesteps, torch.ones(2), LossOptions(), objective
    )
    assert unmasked.item() != pytest.approx(loss.item(), rel=1e-3)
    assert latent_mask({}, prediction.shape) is None


def test_huber_stays_exact_for_a_large_threshold_and_finite_for_a_vanishing_one():
    diff = torch.tensor([[0.0, 1e-3, 0.5, 3.0]])
    target = torch.zeros_like(diff)
    for c in (1e3, 0.1):
        # the textbook formula in 40-digit decimals, where its cancellation costs nothing
        with localcontext() as ctx:
            ctx.prec = 40
            k = Decimal(c)
            exact = [
                2 * k * ((Decimal(d) ** 2 + k * k).sqrt() - k) for d in diff.flatten().tolist()
            ]
            expected = [float(x) for x in exact]
        got = element_loss(diff, target, "huber", torch.tensor([c])).flatten().tolist()
        assert got == pytest.approx(expected, rel=1e-5, abs=1e-12)
    # an exponential schedule's threshold can underflow to 0: smooth_l1 is then 2|d|, not NaN
    got = element_loss(diff, target, "smooth_l1", torch.tensor([0.0])).flatten()
    assert torch.equal(got, 2 * diff.abs().flatten())
