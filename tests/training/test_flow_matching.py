"""Flow-matching math checked against closed forms written here from the papers, and diffusers.

Distribution checks use the Dvoretzky-Kiefer-Wolfowitz bound: with n draws,
P(sup |F_n - F| > eps) <= 2 exp(-2 n eps^2), so eps below makes a false failure a one-in-a-million
event; the draws come from a fixed generator, so the outcome is also reproducible. Each
distribution test also shows that a nearby wrong CDF is rejected, so the bound has teeth.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from library.errors import ConfigError
from library.training import flow_matching as fm

N_DRAWS = 20_000
EPS = math.sqrt(math.log(2 / 1e-6) / (2 * N_DRAWS))  # ~0.019


def _normal_draws(seed: int = 1) -> torch.Tensor:
    return torch.randn(N_DRAWS, generator=torch.Generator().manual_seed(seed))


def _uniform_draws(seed: int = 2) -> torch.Tensor:
    return torch.rand(N_DRAWS, generator=torch.Generator().manual_seed(seed))


def _phi(x: float) -> float:
    """Standard normal CDF."""
    if x == math.inf:
        return 1.0
    if x == -math.inf:
        return 0.0
    return 0.5 * (1.0 + math.erf(x / math.sqrt(2.0)))


def _logit(t: float) -> float:
    if t <= 0.0:
        return -math.inf
    if t >= 1.0:
        return math.inf
    return math.log(t / (1.0 - t))


def _ks_distance(samples: torch.Tensor, cdf) -> float:
    """sup_x |F_n(x) - F(x)| for a continuous F, evaluated on both sides of each jump."""
    xs = np.sort(samples.double().numpy())
    f = np.array([cdf(float(x)) for x in xs])
    n = len(xs)
    above = np.arange(1, n + 1) / n - f
    below = f - np.arange(0, n) / n
    return float(max(above.max(), below.max()))


def _discrete_distance(samples: torch.Tensor, points: list[float], cdf_at: list[float]) -> float:
    """max over the given points of |P_n(X <= p) - P(X <= p)|."""
    xs = samples.double().numpy()
    return max(abs(float((xs <= p).mean()) - c) for p, c in zip(points, cdf_at, strict=True))


# ----------------------------------------------------------------------------- density (SD3 paper)


@pytest.mark.parametrize(("mean", "std"), [(0.0, 1.0), (0.7, 0.5), (-1.0, 1.5)])
def test_logit_normal_density_has_the_logit_normal_cdf(mean, std):
    # u = sigmoid(m + s z) <= t  <=>  z <= (logit t - m) / s
    u = fm.density_u(
        "logit_normal", _normal_draws(), _uniform_draws(), logit_mean=mean, logit_std=std
    )
    assert _ks_distance(u, lambda t: _phi((_logit(t) - mean) / std)) < EPS
    assert _ks_distance(u, lambda t: _phi((_logit(t) - mean - 0.2) / std)) > EPS


@pytest.mark.parametrize("scale", [1.29, 0.0, -0.8, fm.MODE_SCALE_MAX])
def test_mode_density_has_the_cdf_of_its_decreasing_map(scale):
    def f(v: float) -> float:  # the SD3 paper's f_mode, written here from eq. for pi_mode
        return 1.0 - v - scale * (math.cos(math.pi * v / 2) ** 2 - 1.0 + v)

    out = fm.density_u("mode", _normal_draws(), _uniform_draws(), mode_scale=scale)
    assert float(out.min()) >= 0.0 and float(out.max()) <= 1.0
    # f decreases from 1 to 0, so f(U) <= f(v)  <=>  U >= v, of probability 1 - v.
    grid = [i / 50 for i in range(1, 50)]
    points = [f(v) for v in grid]
    assert _discrete_distance(out, points, [1.0 - v for v in grid]) < EPS
    if scale != 0.0:  # the plain uniform CDF must be rejected whenever the map bends
        assert _discrete_distance(out, points, points) > EPS


@pytest.mark.parametrize("scheme", ["uniform", "none", "sigma_sqrt", "cosmap"])
def test_other_weighting_schemes_sample_u_unchanged(scheme):
    u = _uniform_draws()
    assert torch.equal(fm.density_u(scheme, _normal_draws(), u), u)


def test_logit_normal_density_equals_sampling_normal_mean_std():
    # The kohya/diffusers sampler draws normal(mean, std) and takes the sigmoid; from the same
    # generator, mean + std * z is that draw, so the two must agree value by value.
    drawn = torch.normal(0.3, 1.7, size=(4096,), generator=torch.Generator().manual_seed(5))
    z = torch.randn(4096, generator=torch.Generator().manual_seed(5))
    ours = fm.density_u("logit_normal", z, torch.rand(4096), logit_mean=0.3, logit_std=1.7)
    plain = torch.tensor([1 / (1 + math.exp(-x)) for x in drawn.tolist()])
    torch.testing.assert_close(ours, plain, rtol=0, atol=2e-6)


# ----------------------------------------------------------------------------- Flux schemes


def test_uniform_sampling_is_u():
    u = _uniform_draws()
    out = fm.flux_sample_sigmas(_normal_draws(), u, timestep_sampling="uniform")
    assert torch.equal(out.sigmas, u)
    torch.testing.assert_close(out.timesteps, u * 1000)


@pytest.mark.parametrize("scale", [1.0, 2.5, 0.4])
def test_sigmoid_sampling_cdf(scale):
    # sigmoid(a z) <= t  <=>  z <= logit(t) / a
    out = fm.flux_sample_sigmas(
        _normal_draws(), _uniform_draws(), timestep_sampling="sigmoid", sigmoid_scale=scale
    )
    assert _ks_distance(out.sigmas, lambda t: _phi(_logit(t) / scale)) < EPS
    assert _ks_distance(out.sigmas, lambda t: _phi(_logit(t) / (scale * 1.25))) > EPS


@pytest.mark.parametrize(("scale", "shift"), [(1.0, 3.0), (1.0, 3.1582), (2.0, 0.5)])
def test_shift_sampling_cdf(scale, shift):
    # t = shift s / (1 + (shift - 1) s)  inverts to  s = t / (shift - (shift - 1) t), increasing.
    def cdf(t: float, k: float = shift) -> float:
        return _phi(_logit(t / (k - (k - 1.0) * t)) / scale)

    out = fm.flux_sample_sigmas(
        _normal_draws(),
        _uniform_draws(),
        timestep_sampling="shift",
        sigmoid_scale=scale,
        discrete_flow_shift=shift,
    )
    assert _ks_distance(out.sigmas, cdf) < EPS
    assert _ks_distance(out.sigmas, lambda t: cdf(t, shift * 1.3)) > EPS


def test_flux_mu_passes_through_the_published_anchors():
    assert fm.flux_mu(256) == pytest.approx(0.5, abs=1e-12)
    assert fm.flux_mu(4096) == pytest.approx(1.15, abs=1e-12)
    assert fm.flux_mu((256 + 4096) / 2) == pytest.approx((0.5 + 1.15) / 2, abs=1e-12)
    # a 1024x1024 image: 128x128 latents, 2x2 patches -> 64 * 64 tokens
    assert fm.image_seq_len(128, 128, 2) == 4096
    assert fm.image_seq_len(64, 64, 2) == 1024
    assert fm.image_seq_len(64, 64, 1) == 4096


@pytest.mark.parametrize(("seq_len", "scale"), [(4096, 1.0), (1024, 1.0), (256, 1.7)])
def test_flux_shift_sampling_cdf(seq_len, scale):
    # exp(mu) / (exp(mu) + 1/s - 1) has logit = logit(s) + mu, so P(<= t) = Phi((logit t - mu) / a).
    mu = 0.5 + (1.15 - 0.5) * (seq_len - 256) / (4096 - 256)
    out = fm.flux_sample_sigmas(
        _normal_draws(),
        _uniform_draws(),
        timestep_sampling="flux_shift",
        sigmoid_scale=scale,
        image_seq_len=seq_len,
    )
    assert _ks_distance(out.sigmas, lambda t: _phi((_logit(t) - mu) / scale)) < EPS
    assert _ks_distance(out.sigmas, lambda t: _phi((_logit(t) - mu + 0.15) / scale)) > EPS


@pytest.mark.parametrize(("latent_h", "latent_w", "scale"), [(166, 166, 1.0), (64, 96, 1.0), (128, 128, 1.6)])
def test_qwen_shift_is_musubi_tuners_qwen_image_draw(latent_h, latent_w, scale):
    """Per sample, as musubi-tuner's trainer computes it: t = sigmoid(scale * z), mu on the line
    through (256 tokens, 0.5) and (8192 tokens, 0.9) at the latent's (h // 2) * (w // 2) tokens
    (Qwen-Image's scheduler config: base/max_image_seq_len 256/8192, base/max_shift 0.5/0.9),
    then t' = e^mu t / (1 + (e^mu - 1) t)."""
    z = _normal_draws()[:500].double()
    tokens = (latent_h // 2) * (latent_w // 2)
    mu = 0.5 + (tokens - 256) * (0.9 - 0.5) / (8192 - 256)
    shift = math.exp(mu)
    t = 1 / (1 + torch.exp(-scale * z))
    expected = t * shift / (1 + (shift - 1) * t)
    out = fm.flux_sample_sigmas(
        z,
        _uniform_draws()[:500].double(),
        timestep_sampling="qwen_shift",
        sigmoid_scale=scale,
        image_seq_len=fm.image_seq_len(latent_h, latent_w, 2),
    )
    torch.testing.assert_close(out.sigmas, expected, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(out.timesteps, expected * 1000, rtol=1e-10, atol=1e-9)


def test_qwen_shift_at_qwen_images_native_size_is_about_2_2():
    # musubi-tuner's guide: "typically around 2.2 for 1328x1328 images" (166x166 latents)
    assert math.exp(fm.qwen_mu(fm.image_seq_len(166, 166, 2))) == pytest.approx(2.2, abs=0.15)


def test_qwen_shift_needs_the_image_size():
    z = _normal_draws()[:4]
    with pytest.raises(ValueError, match="qwen_shift"):
        fm.flux_sample_sigmas(z, _uniform_draws()[:4], timestep_sampling="qwen_shift")


def test_flux_time_shift_equals_discrete_shift_by_exp_mu():
    s = torch.linspace(0.001, 0.999, 101, dtype=torch.float64)
    mu = 0.83
    expected = math.exp(mu) * s / (1 + (math.exp(mu) - 1) * s)
    torch.testing.assert_close(fm.time_shift_sigmas(s, mu), expected, rtol=1e-12, atol=1e-12)


def test_training_table_matches_diffusers_scheduler():
    from diffusers import FlowMatchEulerDiscreteScheduler

    for shift in (1.0, 3.0):
        scheduler = FlowMatchEulerDiscreteScheduler(num_train_timesteps=1000, shift=shift)
        torch.testing.assert_close(
            fm.training_schedule_sigmas(shift), scheduler.sigmas, rtol=0, atol=1e-7
        )


@pytest.mark.parametrize(
    ("scheme", "kwargs"),
    [
        ("logit_normal", {"logit_mean": 0.0, "logit_std": 1.0}),
        ("logit_normal", {"logit_mean": 0.8, "logit_std": 0.6}),
        ("uniform", {}),
    ],
)
def test_sigma_sampling_indexes_the_descending_shifted_table(scheme, kwargs):
    shift = 3.0
    m, sd = kwargs.get("logit_mean", 0.0), kwargs.get("logit_std", 1.0)

    def density_cdf(t: float) -> float:
        if scheme == "uniform":
            return min(max(t, 0.0), 1.0)
        return _phi((_logit(t) - m) / sd)

    out = fm.flux_sample_sigmas(
        _normal_draws(),
        _uniform_draws(),
        timestep_sampling="sigma",
        discrete_flow_shift=shift,
        weighting_scheme=scheme,
        **kwargs,
    )
    # Entry k of the table is shift applied to (1000 - k) / 1000, and index k = floor(1000 u):
    # sigma <= entry k  <=>  index >= k  <=>  u >= k / 1000.
    ks = list(range(0, 1000, 7))
    points = [shift * ((1000 - k) / 1000) / (1 + (shift - 1) * (1000 - k) / 1000) for k in ks]
    expected = [1.0 - density_cdf(k / 1000) for k in ks]
    assert _discrete_distance(out.sigmas, [p * (1 + 1e-6) for p in points], expected) < EPS
    # every value is an entry of the table
    table = torch.tensor(
        [shift * (j / 1000) / (1 + (shift - 1) * j / 1000) for j in range(1, 1001)]
    )
    nearest = (out.sigmas[:, None] - table[None, :]).abs().min(dim=1).values
    assert float(nearest.max()) < 1e-6
    torch.testing.assert_close(out.timesteps, out.sigmas * 1000)


def test_sigma_sampling_reverses_the_density_while_sd3_does_not():
    # logit_mean > 0 pushes the density toward 1: small sigmas for Flux's table lookup, large for SD3.
    z, u = _normal_draws(), _uniform_draws()
    flux = fm.flux_sample_sigmas(
        z,
        u,
        timestep_sampling="sigma",
        discrete_flow_shift=1.0,
        weighting_scheme="logit_normal",
        logit_mean=1.0,
    )
    sd3 = fm.sd3_sample_sigmas(z, u, weighting_scheme="logit_normal", logit_mean=1.0)
    assert float(flux.sigmas.mean()) < 0.35 < 0.65 < float(sd3.sigmas.mean())


def test_sigma_sampling_never_indexes_past_the_table():
    z = torch.tensor([40.0, -40.0])
    u = torch.tensor([0.0, 0.999999])
    lookups = fm.flux_sample_sigmas(
        z, u, timestep_sampling="sigma", weighting_scheme="logit_normal", discrete_flow_shift=3.0
    )
    table = fm.training_schedule_sigmas(3.0)
    assert lookups.sigmas.tolist() == [table[-1].item(), table[0].item()]
    mode = fm.flux_sample_sigmas(z, u, timestep_sampling="sigma", weighting_scheme="mode")
    assert mode.sigmas[0].item() == table[-1].item()  # mode maps u = 0 to density 1


# ----------------------------------------------------------------------------- SD3 sampler


@pytest.mark.parametrize(
    ("scheme", "shift", "low", "high"),
    [("logit_normal", 1.0, None, None), ("logit_normal", 3.0, 100, 900), ("uniform", 2.0, 0, 500)],
)
def test_sd3_sampling_cdf(scheme, shift, low, high):
    t_min = 0 if low is None else low
    t_max = 1000 if high is None else high
    span = t_max - t_min

    def density_cdf(t: float) -> float:
        t = min(max(t, 0.0), 1.0)
        return t if scheme == "uniform" else _phi(_logit(t))

    def unshift(v: float) -> float:  # inverse of v = k s / (1 + (k - 1) s)
        return v / (shift - (shift - 1) * v)

    out = fm.sd3_sample_sigmas(
        _normal_draws(),
        _uniform_draws(),
        weighting_scheme=scheme,
        training_shift=shift,
        min_timestep=low,
        max_timestep=high,
    )
    # timestep <= j  <=>  v * span + t_min < j + 1  <=>  u < unshift((j + 1 - t_min) / span)
    js = list(range(t_min, t_max, 5))
    expected = [density_cdf(unshift(min((j + 1 - t_min) / span, 1.0))) for j in js]
    assert _discrete_distance(out.timesteps, [j + 1e-6 for j in js], expected) < EPS
    assert float(out.timesteps.min()) >= t_min and float(out.timesteps.max()) <= t_max
    assert torch.equal(out.timesteps, out.timesteps.floor())
    torch.testing.assert_close(out.sigmas, out.timesteps / 1000)


def test_sd3_equal_min_and_max_fix_the_timestep():
    out = fm.sd3_sample_sigmas(
        _normal_draws()[:64], _uniform_draws()[:64], min_timestep=250, max_timestep=250
    )
    assert torch.all(out.timesteps == 250) and torch.all(out.sigmas == 0.25)


# ----------------------------------------------------------------------------- noising / target


@pytest.mark.parametrize("shape", [(3, 5), (3, 4, 6, 6), (3, 4, 2, 6, 6)])
def test_noisy_latents_end_points_and_plain_reference(shape):
    gen = torch.Generator().manual_seed(3)
    x0 = torch.randn(shape, generator=gen, dtype=torch.float64)
    noise = torch.randn(shape, generator=gen, dtype=torch.float64)
    batch = shape[0]
    torch.testing.assert_close(fm.noisy_latents(x0, noise, torch.zeros(batch)), x0)
    torch.testing.assert_close(fm.noisy_latents(x0, noise, torch.ones(batch)), noise)
    sigmas = torch.tensor([0.1, 0.5, 0.93], dtype=torch.float64)
    got = fm.noisy_latents(x0, noise, sigmas)
    for b in range(batch):
        s = float(sigmas[b])
        torch.testing.assert_close(got[b], (1 - s) * x0[b] + s * noise[b], rtol=0, atol=1e-15)


def test_target_is_the_derivative_of_the_path():
    gen = torch.Generator().manual_seed(4)
    x0 = torch.randn(3, 4, 5, 5, generator=gen, dtype=torch.float64)
    noise = torch.randn(3, 4, 5, 5, generator=gen, dtype=torch.float64)
    sigmas = torch.tensor([0.2, 0.6, 0.95], dtype=torch.float64)
    # Forward-mode autograd with tangent 1 on every sigma: each element depends on its own
    # sample's sigma only, so the tangent of x_t is d x_t / d sigma element by element.
    import torch.autograd.forward_ad as fwad

    with fwad.dual_level():
        dual = fwad.make_dual(sigmas, torch.ones_like(sigmas))
        derivative = fwad.unpack_dual(fm.noisy_latents(x0, noise, dual)).tangent
    torch.testing.assert_close(fm.velocity_target(x0, noise), derivative, rtol=0, atol=1e-12)


# ----------------------------------------------------------------------------- prediction types


@pytest.mark.parametrize("scheme", ["uniform", "sigma_sqrt", "cosmap", "logit_normal"])
@pytest.mark.parametrize("kind", ["raw", "additive", "sigma_scaled"])
def test_model_prediction_types_against_the_formulas(kind, scheme):
    gen = torch.Generator().manual_seed(6)
    out = torch.randn(3, 4, 3, 3, generator=gen, dtype=torch.float64)
    x_t = torch.randn(3, 4, 3, 3, generator=gen, dtype=torch.float64)
    sigmas = torch.tensor([0.15, 0.5, 0.85], dtype=torch.float64)
    pred, weighting = fm.apply_model_prediction_type(out, x_t, sigmas, kind, scheme)
    for b in range(3):
        s = float(sigmas[b])
        want = {"raw": out[b], "additive": out[b] + x_t[b], "sigma_scaled": x_t[b] - s * out[b]}[
            kind
        ]
        torch.testing.assert_close(pred[b], want, rtol=0, atol=1e-15)
    if kind != "sigma_scaled":
        assert weighting is None
    else:
        want_w = {
            "sigma_sqrt": [1 / s**2 for s in sigmas.tolist()],
            "cosmap": [2 / (math.pi * (1 - 2 * s + 2 * s * s)) for s in sigmas.tolist()],
        }.get(scheme, [1.0, 1.0, 1.0])
        torch.testing.assert_close(weighting, torch.tensor(want_w, dtype=torch.float64))


def test_sigma_scaled_turns_the_exact_velocity_into_x0():
    gen = torch.Generator().manual_seed(7)
    x0 = torch.randn(2, 4, 3, 3, generator=gen, dtype=torch.float64)
    noise = torch.randn(2, 4, 3, 3, generator=gen, dtype=torch.float64)
    sigmas = torch.tensor([0.3, 0.8], dtype=torch.float64)
    x_t = fm.noisy_latents(x0, noise, sigmas)
    pred, _ = fm.apply_model_prediction_type(noise - x0, x_t, sigmas, "sigma_scaled")
    torch.testing.assert_close(pred, x0, rtol=0, atol=1e-12)


# ----------------------------------------------------------------------------- weighting


@pytest.mark.parametrize("scheme", list(fm.WEIGHTING_SCHEMES))
def test_loss_weighting_formulas(scheme):
    sigmas = torch.tensor([0.01, 0.25, 0.5, 0.75, 1.0], dtype=torch.float64)
    plain = {
        "sigma_sqrt": lambda s: s**-2.0,
        "cosmap": lambda s: 2.0 / (math.pi * (1.0 - 2.0 * s + 2.0 * s * s)),
    }.get(scheme, lambda s: 1.0)
    got = fm.loss_weighting(scheme, sigmas)
    assert got.shape == (5,)
    torch.testing.assert_close(
        got, torch.tensor([plain(s) for s in sigmas.tolist()], dtype=torch.float64)
    )


def test_loss_weighting_of_half_precision_sigmas_is_float32():
    got = fm.loss_weighting("sigma_sqrt", torch.tensor([0.5], dtype=torch.bfloat16))
    assert got.dtype == torch.float32 and got.item() == 4.0


# ----------------------------------------------------------------------------- timesteps


def test_timestep_conversions():
    sigmas = torch.tensor([0.0, 0.125, 0.5, 1.0])
    timesteps = fm.sigma_to_timestep(sigmas)
    assert timesteps.tolist() == [0.0, 125.0, 500.0, 1000.0]
    assert fm.flux_model_timestep(timesteps).tolist() == sigmas.tolist()


# ----------------------------------------------------------------------------- sampler


def _diffusers_flux_scheduler(dev: bool):
    from diffusers import FlowMatchEulerDiscreteScheduler

    if dev:  # the scheduler config of black-forest-labs/FLUX.1-dev
        return FlowMatchEulerDiscreteScheduler(
            num_train_timesteps=1000,
            shift=3.0,
            use_dynamic_shifting=True,
            base_shift=0.5,
            max_shift=1.15,
            base_image_seq_len=256,
            max_image_seq_len=4096,
        )
    return FlowMatchEulerDiscreteScheduler(num_train_timesteps=1000, shift=1.0)  # FLUX.1-schnell


@pytest.mark.parametrize(("steps", "seq_len"), [(28, 4096), (20, 1024), (50, 2304), (1, 4096)])
def test_flux_dev_schedule_matches_diffusers(steps, seq_len):
    scheduler = _diffusers_flux_scheduler(dev=True)
    mu = fm.flux_mu(seq_len)
    # what FluxPipeline passes: sigmas = linspace(1, 1/N, N) and mu from calculate_shift
    scheduler.set_timesteps(sigmas=np.linspace(1.0, 1 / steps, steps).tolist(), mu=mu)
    ours = fm.flux_sampling_sigmas(steps, mu)
    assert ours.shape == (steps + 1,) and ours[-1].item() == 0.0
    torch.testing.assert_close(ours, scheduler.sigmas, rtol=0, atol=1e-6)
    torch.testing.assert_close(
        fm.sigma_to_timestep(ours[:-1]), scheduler.timesteps, rtol=0, atol=1e-3
    )


def test_flux_schnell_schedule_matches_diffusers():
    scheduler = _diffusers_flux_scheduler(dev=False)
    scheduler.set_timesteps(sigmas=np.linspace(1.0, 1 / 4, 4).tolist())
    torch.testing.assert_close(fm.flux_sampling_sigmas(4), scheduler.sigmas, rtol=0, atol=1e-6)
    assert fm.flux_sampling_sigmas(4).tolist() == [1.0, 0.75, 0.5, 0.25, 0.0]


@pytest.mark.parametrize(("steps", "shift"), [(28, 3.0), (40, 3.0), (10, 1.0)])
def test_sd3_schedule_matches_diffusers(steps, shift):
    from diffusers import FlowMatchEulerDiscreteScheduler

    scheduler = FlowMatchEulerDiscreteScheduler(num_train_timesteps=1000, shift=shift)
    scheduler.set_timesteps(steps)
    torch.testing.assert_close(
        fm.sd3_sampling_sigmas(steps, shift), scheduler.sigmas, rtol=0, atol=1e-6
    )


@pytest.mark.parametrize("steps", [1, 4, 28])
def test_euler_with_the_exact_velocity_lands_on_x0(steps):
    gen = torch.Generator().manual_seed(8)
    x0 = torch.randn(2, 4, 6, 6, generator=gen, dtype=torch.float64)
    noise = torch.randn(2, 4, 6, 6, generator=gen, dtype=torch.float64)
    schedule = fm.flux_sampling_sigmas(steps, fm.flux_mu(4096)).double()
    x = noise.clone()  # sigma 1: pure noise
    for i in range(steps):
        s, s_next = float(schedule[i]), float(schedule[i + 1])
        x = fm.euler_step(x, noise - x0, s, s_next)
        # the straight path is followed exactly at every step, not only at the end
        torch.testing.assert_close(x, (1 - s_next) * x0 + s_next * noise, rtol=0, atol=1e-12)
    torch.testing.assert_close(x, x0, rtol=0, atol=1e-12)


def test_euler_step_formula():
    x, v = torch.tensor([1.0, -2.0]), torch.tensor([0.5, 4.0])
    assert fm.euler_step(x, v, 0.8, 0.6).tolist() == pytest.approx([1.0 - 0.1, -2.0 - 0.8])


# ----------------------------------------------------------------------------- validation


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("timestep_sampling", "logit"),
        ("weighting_scheme", "lognorm"),
        ("model_prediction_type", "epsilon"),
        ("sigmoid_scale", 0.0),
        ("sigmoid_scale", -1.0),
        ("discrete_flow_shift", 0.0),
        ("discrete_flow_shift", float("nan")),
        ("training_shift", -3.0),
        ("logit_std", 0.0),
        ("logit_mean", float("inf")),
        ("mode_scale", 1.8),
        ("mode_scale", -1.5),
        ("min_timestep", -1),
        ("max_timestep", 1001),
    ],
)
def test_impossible_values_raise_one_line_naming_the_key(key, value):
    with pytest.raises(ValueError) as info:
        fm.validate_flow_options(**{key: value})
    message = str(info.value)
    assert key in message and "\n" not in message
    assert isinstance(info.value, ConfigError)


def test_min_above_max_timestep_is_rejected_and_kohya_defaults_pass():
    with pytest.raises(ValueError, match="min_timestep"):
        fm.validate_flow_options(min_timestep=600, max_timestep=500)
    fm.validate_flow_options(
        timestep_sampling="sigma",
        sigmoid_scale=1.0,
        discrete_flow_shift=3.0,
        weighting_scheme="uniform",
        logit_mean=0.0,
        logit_std=1.0,
        mode_scale=1.29,
        model_prediction_type="sigma_scaled",
        training_shift=1.0,
        min_timestep=0,
        max_timestep=1000,
    )


def test_samplers_validate_what_they_use():
    z, u = _normal_draws()[:4], _uniform_draws()[:4]
    with pytest.raises(ValueError, match="sigmoid_scale"):
        fm.flux_sample_sigmas(z, u, timestep_sampling="shift", sigmoid_scale=0.0)
    with pytest.raises(ValueError, match="discrete_flow_shift"):
        fm.flux_sample_sigmas(z, u, timestep_sampling="shift", discrete_flow_shift=-1.0)
    with pytest.raises(ValueError, match="logit_std"):
        fm.sd3_sample_sigmas(z, u, weighting_scheme="logit_normal", logit_std=0.0)
    with pytest.raises(ValueError, match="timestep_sampling"):
        fm.flux_sample_sigmas(z, u, timestep_sampling="flow")
    with pytest.raises(ValueError, match="image_seq_len"):
        fm.flux_sample_sigmas(z, u, timestep_sampling="flux_shift")
    with pytest.raises(ValueError, match="shape"):
        fm.flux_sample_sigmas(z, u[:3], timestep_sampling="uniform")


def test_hand_worked_values():
    z = torch.zeros(3)
    u = torch.tensor([0.0, 0.0015, 0.9995])
    # Flux "sigma", uniform density, shift 3: index floor(1000 u) = 0, 1, 999 into the table
    # 3 (1 - k/1000) / (1 + 2 (1 - k/1000)).
    flux = fm.flux_sample_sigmas(z, u, timestep_sampling="sigma", discrete_flow_shift=3.0)
    want = [1.0, 3 * 0.999 / (1 + 2 * 0.999), 3 * 0.001 / (1 + 2 * 0.001)]
    torch.testing.assert_close(flux.sigmas, torch.tensor(want), rtol=0, atol=1e-7)
    # SD3, uniform density, no shift, timesteps [100, 900): floor(800 u + 100) = 100, 101, 899.
    sd3 = fm.sd3_sample_sigmas(z, u, min_timestep=100, max_timestep=900)
    assert sd3.timesteps.tolist() == [100.0, 101.0, 899.0]
    # "shift" at z = 0: sigmoid gives 1/2, then 3 * 0.5 / (1 + 2 * 0.5) = 0.75.
    shift = fm.flux_sample_sigmas(z, u, timestep_sampling="shift", discrete_flow_shift=3.0)
    torch.testing.assert_close(shift.sigmas, torch.full((3,), 0.75))
    # "flux_shift" at z = 0 and 4096 tokens: e^1.15 / (e^1.15 + 1).
    fs = fm.flux_sample_sigmas(z, u, timestep_sampling="flux_shift", image_seq_len=4096)
    torch.testing.assert_close(fs.sigmas, torch.full((3,), 1 / (1 + math.exp(-1.15))))
