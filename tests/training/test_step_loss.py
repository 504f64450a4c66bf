"""micro_batch_loss against a plain-PyTorch computation of the same diffusion loss."""

import pytest
import torch
from cpu_inputs import cpu_inputs, plain_text_states

from library.config.schema import ModelSection, TrainingSection
from library.errors import ConfigError
from library.models.loader import load_components
from library.training.loss import LossOptions
from library.training.noise import NoiseOptions, draw
from library.training.step import micro_batch_loss


def _alpha_bar(steps):
    betas = torch.linspace(0.00085**0.5, 0.012**0.5, 1000, dtype=torch.float64) ** 2
    return torch.cumprod(1 - betas, 0)[steps].float().view(-1, 1, 1, 1)


def _noise(d, x0, extra):
    """Target noise and input noise, composed by hand from the keyed draws."""
    offset, multires, ip_gamma = (
        extra.get("noise_offset", 0.0),
        extra.get("multires"),
        extra.get("ip"),
    )
    eps = d.noise + offset * d.offset
    if multires:
        eps = eps + d.pyramid
        eps = torch.stack([e / e.std() for e in eps])
    return eps, (eps + ip_gamma * d.ip_noise if ip_gamma else eps)


def _reference_loss(c, batch, seed, gamma, extra):
    """The textbook loss, written out: x_t = sqrt(a) x0 + sqrt(1-a) eps; v = sqrt(a) eps - sqrt(1-a) x0."""
    with torch.no_grad():
        posterior = c.vae.encode(batch["pixel_values"]).latent_dist
        shape = tuple(posterior.mean.shape[1:])
        options = NoiseOptions(
            multires_noise_iterations=extra.get("multires", 0), ip_noise_gamma=extra.get("ip", 0.0)
        )
        d = draw(
            seed,
            batch["epoch"],
            batch["positions"].tolist(),
            shape,
            1000,
            torch.device("cpu"),
            options,
        )
        x0 = (posterior.mean + posterior.std * d.latent_eps) * c.vae.config.scaling_factor
        eps, eps_in = _noise(d, x0, extra)
        a = _alpha_bar(d.timesteps)
        xt = a.sqrt() * x0 + (1 - a).sqrt() * eps_in
        hidden = plain_text_states(c, batch["captions"])
        pred = c.denoiser(xt, d.timesteps, hidden).sample
        v_pred = c.family.prediction_type == "v_prediction"
        target = a.sqrt() * eps - (1 - a).sqrt() * x0 if v_pred else eps
        snr = (a / (1 - a)).view(-1)
        snr_w = (
            torch.clamp(snr, max=gamma) / (snr + 1 if v_pred else snr)
            if gamma
            else torch.ones_like(snr)
        )
        if extra.get("huber_c"):  # kohya's snr schedule: c_t = (1 - c) / (1 + sigma_t)^2 + c
            ct = ((1 - extra["huber_c"]) / (1 + snr.rsqrt()) ** 2 + extra["huber_c"]).view(
                -1, 1, 1, 1
            )
            elements = 2 * ct * (torch.sqrt((pred - target) ** 2 + ct**2) - ct)
        else:
            elements = (pred - target) ** 2
        if extra.get("debiased"):
            capped = torch.clamp(snr, max=1000)
            snr_w = snr_w * (1 / (capped + 1) if v_pred else capped.rsqrt())
        per_sample = elements.mean(dim=(1, 2, 3))
        return (per_sample * batch["loss_weights"] * snr_w).mean()


def _setup(request, which):
    model_dir = request.getfixturevalue(
        "tiny_model_dir" if which == "sd1" else "tiny_sd2v_model_dir"
    )
    c = load_components(ModelSection(pretrained_model_name_or_path=str(model_dir)), torch.float32)
    torch.manual_seed(3)
    batch = {
        "pixel_values": torch.rand(3, 3, 64, 64) * 2 - 1,
        "captions": ["a red circle", "shape", "a blue square on gray"],
        "loss_weights": torch.tensor([1.0, 0.5, 1.0]),
        "positions": torch.tensor([4, 0, 9]),
        "epoch": 2,
    }
    return c, batch


def _inputs(c, **options):
    return cpu_inputs(c, 11, **options)


@pytest.mark.parametrize("which", ["sd1", "sd2v"])
@pytest.mark.parametrize("gamma,offset", [(None, 0.0), (5.0, 0.1)])
def test_loss_matches_reference(which, gamma, offset, request):
    c, batch = _setup(request, which)
    inputs = _inputs(
        c, noise=NoiseOptions(noise_offset=offset), loss=LossOptions(min_snr_gamma=gamma)
    )
    with torch.no_grad():
        ours = micro_batch_loss(inputs, batch)
    expected = _reference_loss(c, batch, 11, gamma, {"noise_offset": offset})
    assert torch.allclose(ours, expected, rtol=1e-5, atol=1e-7), (ours.item(), expected.item())
    # and the per-sample keys matter: other positions give another loss
    with torch.no_grad():
        other = micro_batch_loss(inputs, {**batch, "positions": torch.tensor([5, 1, 10])})
    assert not torch.allclose(ours, other)


@pytest.mark.parametrize("which", ["sd1", "sd2v"])
def test_huber_ip_noise_multires_and_debiased_match_reference(which, request):
    c, batch = _setup(request, which)
    training = TrainingSection(
        noise_offset=0.05,
        multires_noise_iterations=5,
        multires_noise_discount=0.3,
        ip_noise_gamma=0.1,
        loss_type="huber",
        huber_schedule="snr",
        huber_c=0.2,
        debiased_estimation_loss=True,
        min_snr_gamma=5.0,
    )
    inputs = _inputs(
        c, noise=NoiseOptions.from_training(training), loss=LossOptions.from_training(training)
    )
    with torch.no_grad():
        ours = micro_batch_loss(inputs, batch)
    extra = {"noise_offset": 0.05, "multires": 5, "ip": 0.1, "huber_c": 0.2, "debiased": True}
    expected = _reference_loss(c, batch, 11, 5.0, extra)
    assert torch.allclose(ours, expected, rtol=1e-5, atol=1e-7), (ours.item(), expected.item())
    plain = _reference_loss(c, batch, 11, 5.0, {"noise_offset": 0.05})
    assert not torch.allclose(ours, plain)  # the options change the loss


def test_options_are_checked_against_the_model(request):
    c, _ = _setup(request, "sd1")
    with pytest.raises(ConfigError, match="scale_v_pred_loss_like_noise_pred"):
        _inputs(c, loss=LossOptions(scale_v_pred_loss_like_noise_pred=True))
    with pytest.raises(ConfigError, match="max_timestep"):
        _inputs(c, noise=NoiseOptions(max_timestep=1200))


def _one(batch, i):
    return {k: v if k == "epoch" else v[i : i + 1] for k, v in batch.items()}


def test_batch_loss_is_the_mean_of_single_sample_losses_with_every_option(request):
    """Layout invariance end to end: no option mixes samples of a micro-batch."""
    c, batch = _setup(request, "sd1")
    training = TrainingSection(
        noise_offset=0.1,
        noise_offset_random_strength=True,
        adaptive_noise_scale=0.02,
        multires_noise_iterations=4,
        ip_noise_gamma=0.1,
        ip_noise_gamma_random_strength=True,
        min_timestep=50,
        max_timestep=950,
        loss_type="smooth_l1",
        huber_schedule="exponential",
        debiased_estimation_loss=True,
        v_pred_like_loss=0.1,
    )
    inputs = _inputs(
        c, noise=NoiseOptions.from_training(training), loss=LossOptions.from_training(training)
    )
    with torch.no_grad():
        together = micro_batch_loss(inputs, batch)
        singles = [micro_batch_loss(inputs, _one(batch, i)) for i in range(3)]
    assert torch.allclose(together, torch.stack(singles).mean(), rtol=1e-4)
