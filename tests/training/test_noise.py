"""Per-sample draws: stable, layout-invariant, and the noise options against hand computations."""

import pytest
import torch

from library.errors import ConfigError
from library.training.noise import NoiseOptions, draw, sample_seed, training_noise

CPU = torch.device("cpu")
SHAPE = (4, 8, 8)
ALL_ON = NoiseOptions(
    noise_offset=0.1,
    noise_offset_random_strength=True,
    adaptive_noise_scale=0.05,
    multires_noise_iterations=4,
    multires_noise_discount=0.4,
    ip_noise_gamma=0.1,
    ip_noise_gamma_random_strength=True,
    min_timestep=100,
    max_timestep=700,
)


def test_sample_seed_is_stable_and_distinct():
    assert sample_seed(1, 2, 3) == sample_seed(1, 2, 3)
    keys = {(s, e, p) for s in range(3) for e in range(3) for p in range(20)}
    assert len({sample_seed(*k) for k in keys}) == len(keys)
    assert 0 <= sample_seed(42, 0, 0) < 2**63
    assert sample_seed(1, 2, 3, "multires") != sample_seed(1, 2, 3)


def test_main_stream_is_unchanged_by_the_new_options():
    """The first draws of a sample are what they were before the noise options existed."""
    gen = torch.Generator().manual_seed(sample_seed(7, 1, 5))
    eps, noise = torch.randn(SHAPE, generator=gen), torch.randn(SHAPE, generator=gen)
    step = torch.randint(0, 1000, (1,), generator=gen)
    offset = torch.randn((4, 1, 1), generator=gen)
    for options in (None, ALL_ON):
        d = draw(7, 1, [5], SHAPE, 1000, CPU, options)
        assert torch.equal(d.latent_eps[0], eps) and torch.equal(d.noise[0], noise)
        assert torch.equal(d.offset[0], offset)
    assert draw(7, 1, [5], SHAPE, 1000, CPU).timesteps.item() == step.item()


@pytest.mark.parametrize("options", [NoiseOptions(), ALL_ON])
def test_draws_and_noise_do_not_depend_on_batching(options):
    positions = [0, 1, 2, 3]
    together = draw(7, 1, positions, SHAPE, 1000, CPU, options)
    singles = [draw(7, 1, [p], SHAPE, 1000, CPU, options) for p in positions]
    for field in together.__dataclass_fields__:
        value = getattr(together, field)
        if value is None:
            assert all(getattr(s, field) is None for s in singles), field
            continue
        assert torch.equal(value, torch.cat([getattr(s, field) for s in singles])), field
    latents = torch.randn(4, *SHAPE)
    noise, input_noise = training_noise(together, latents, options)
    for i, single in enumerate(singles):
        n1, in1 = training_noise(single, latents[i : i + 1], options)
        assert torch.allclose(noise[i : i + 1], n1, atol=1e-6)
        assert torch.allclose(input_noise[i : i + 1], in1, atol=1e-6)


def test_draws_differ_between_epochs_and_positions():
    a = draw(7, 0, [0], SHAPE, 1000, CPU)
    b = draw(7, 1, [0], SHAPE, 1000, CPU)
    c = draw(7, 0, [1], SHAPE, 1000, CPU)
    assert not torch.equal(a.noise, b.noise)
    assert not torch.equal(a.noise, c.noise)
    assert not torch.equal(a.noise, a.latent_eps)
    assert a.offset.shape == (1, 4, 1, 1)
    assert a.ip_noise is None and a.pyramid is None


def test_timesteps_stay_in_range():
    options = NoiseOptions(min_timestep=200, max_timestep=260)
    steps = draw(3, 0, list(range(300)), (1, 2, 2), 1000, CPU, options).timesteps
    assert steps.min() >= 200 and steps.max() < 260 and len(set(steps.tolist())) > 40
    fixed = draw(
        3, 0, list(range(5)), (1, 2, 2), 1000, CPU, NoiseOptions(min_timestep=500, max_timestep=500)
    )
    assert fixed.timesteps.tolist() == [500] * 5


@pytest.mark.parametrize(
    "low,high", [(0, 1001), (1000, None), (600, 500)], ids=["above", "min-at-T", "inverted"]
)
def test_bad_timestep_ranges_are_config_errors(low, high):
    with pytest.raises(ConfigError, match="min_timestep"):
        NoiseOptions(min_timestep=low, max_timestep=high).timestep_range(1000)


def test_offset_random_strength_and_adaptive_scale():
    d = draw(5, 0, [0, 1], SHAPE, 1000, CPU, ALL_ON)
    latents = torch.randn(2, *SHAPE)
    opts = NoiseOptions(
        noise_offset=0.1, noise_offset_random_strength=True, adaptive_noise_scale=-0.3
    )
    noise, input_noise = training_noise(d, latents, opts)
    for b in range(2):
        for ch in range(4):
            mean = abs(latents[b, ch].mean().item())
            strength = max(0.0, 0.1 * d.offset_strength[b].item() - 0.3 * mean)
            expected = d.noise[b, ch] + strength * d.offset[b, ch]
            assert torch.allclose(noise[b, ch], expected, atol=1e-6)
    assert torch.equal(noise, input_noise)  # no ip_noise_gamma: the input gets the same noise


def test_input_perturbation_touches_only_the_input():
    opts = NoiseOptions(ip_noise_gamma=0.2, ip_noise_gamma_random_strength=True)
    d = draw(5, 0, [0, 1], SHAPE, 1000, CPU, opts)
    gen = torch.Generator().manual_seed(sample_seed(5, 0, 1, "ip_noise"))
    assert torch.equal(d.ip_noise[1], torch.randn(SHAPE, generator=gen))
    noise, input_noise = training_noise(d, torch.zeros(2, *SHAPE), opts)
    assert torch.equal(noise, d.noise)
    for b in range(2):
        expected = d.noise[b] + 0.2 * d.ip_strength[b].item() * d.ip_noise[b]
        assert torch.allclose(input_noise[b], expected, atol=1e-6)


def _reference_pyramid(seed, epoch, position, shape, iterations, discount):
    """The multires recipe written out: octave i at size/r^i (r in [2,4)), weight discount^i."""
    gen = torch.Generator().manual_seed(sample_seed(seed, epoch, position, "multires"))
    c, h, w = shape
    up = torch.nn.Upsample(size=(h, w), mode="bilinear")
    total = torch.zeros(1, c, h, w)
    for i in range(iterations):
        r = torch.rand((), generator=gen, dtype=torch.float64).item() * 2 + 2
        hn, wn = max(1, int(h / (r**i))), max(1, int(w / (r**i)))
        total = total + up(torch.randn(1, c, hn, wn, generator=gen)) * discount**i
        if hn == 1 or wn == 1:
            break
    return total[0]


@pytest.mark.parametrize("iterations", [1, 3, 10])
def test_multires_noise_matches_an_independent_recipe(iterations):
    opts = NoiseOptions(multires_noise_iterations=iterations, multires_noise_discount=0.3)
    shape = (4, 16, 12)
    d = draw(9, 2, [3, 8], shape, 1000, CPU, opts)
    noise, _ = training_noise(d, torch.zeros(2, *shape), opts)
    for b, position in enumerate([3, 8]):
        summed = d.noise[b] + _reference_pyramid(9, 2, position, shape, iterations, 0.3)
        expected = summed / summed.std()
        assert torch.allclose(noise[b], expected, atol=1e-5)
        assert abs(noise[b].std().item() - 1.0) < 1e-5
