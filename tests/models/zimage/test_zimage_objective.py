"""Z-Image's objective against diffusers: the pipeline's timestep input and scheduler step
recorded inside a real run, the scheduler's sigmas and noising, and the target's sign."""

from __future__ import annotations

import pytest
import torch

from library.models.families.zimage.objective import DRAW, ZImageFlowObjective
from library.models.families.zimage.shapes import scheduler_config
from library.training.objectives import FlowOptions
from tests.models.zimage.flow_helpers import euler_step, sampling_sigmas

OBJECTIVE = ZImageFlowObjective(DRAW.options(None))


@pytest.fixture(scope="module")
def recorded_run(zimage_pipe):
    """Three steps of the pipeline with the transformer's inputs/outputs and the latents after
    each scheduler step recorded."""
    calls, after = [], []

    def hook(module, args, kwargs, output):
        calls.append((args[1].clone(), [o.detach().clone() for o in output[0]]))

    def on_step_end(pipe, i, t, tensors):
        after.append(tensors["latents"].clone())
        return {}

    start = torch.randn(2, 16, 8, 8, generator=torch.Generator().manual_seed(5))
    handle = zimage_pipe.transformer.register_forward_hook(hook, with_kwargs=True)
    try:
        zimage_pipe(
            ["a cat", "a thin dog"],
            height=64,
            width=64,
            num_inference_steps=3,
            guidance_scale=0.0,
            latents=start.clone(),
            output_type="latent",
            callback_on_step_end=on_step_end,
        )
    finally:
        handle.remove()
    return start, calls, after, zimage_pipe.scheduler.sigmas.clone()


def test_sampling_sigmas_are_the_pipeline_schedule(recorded_run):
    *_, scheduler_sigmas = recorded_run
    ours = sampling_sigmas(3, shift=3.0)
    assert torch.equal(ours, scheduler_sigmas)
    assert ours[-1] == 0 and ours[0] == 1


def test_model_timestep_is_what_the_pipeline_feeds(recorded_run):
    _, calls, _, sigmas = recorded_run
    for i, (t, _) in enumerate(calls):
        expected = OBJECTIVE.model_time(sigmas[i].expand(2))
        assert torch.equal(t, expected), i
        assert torch.allclose(t, 1 - sigmas[i].expand(2), atol=1e-6)


def test_euler_step_on_raw_output_is_the_scheduler_step(recorded_run):
    start, calls, after, sigmas = recorded_run
    latents = start
    for i, (_, outputs) in enumerate(calls):
        raw = torch.stack(outputs).squeeze(2)
        stepped = euler_step(latents, raw, sigmas[i], sigmas[i + 1])
        assert torch.equal(stepped, after[i]), i
        latents = after[i]


def test_noising_is_the_scheduler_scale_noise():
    from diffusers import FlowMatchEulerDiscreteScheduler

    scheduler = FlowMatchEulerDiscreteScheduler(**scheduler_config("turbo"))
    scheduler.set_timesteps(sigmas=[1.0, 0.6, 0.2], mu=None)
    g = torch.Generator().manual_seed(1)
    x0, noise = torch.randn(2, 16, 4, 4, generator=g), torch.randn(2, 16, 4, 4, generator=g)
    timesteps = scheduler.timesteps[1:].clone()  # one per sample
    theirs = scheduler.scale_noise(x0, timesteps, noise)
    sigmas = scheduler.sigmas[1:3]
    assert torch.allclose(OBJECTIVE.noisy(x0, noise, sigmas), theirs, atol=1e-6)


def test_perfect_predictor_has_zero_loss_and_the_wrong_sign_does_not():
    # The raw output that carries x_t along the straight path to x_{t'} under the pipeline's
    # update x' = x + (s' - s) * (-raw): raw = -(x' - x) / (s' - s), with x, x' diffusers'
    # own noising at s and s'.
    from diffusers import FlowMatchEulerDiscreteScheduler

    scheduler = FlowMatchEulerDiscreteScheduler(**scheduler_config("base"))
    scheduler.set_timesteps(sigmas=[0.9, 0.4], mu=None)
    g = torch.Generator().manual_seed(2)
    x0, noise = torch.randn(1, 16, 4, 4, generator=g), torch.randn(1, 16, 4, 4, generator=g)
    s, s_next = scheduler.sigmas[0], scheduler.sigmas[1]
    x = scheduler.scale_noise(x0, scheduler.timesteps[:1], noise)
    x_next = scheduler.scale_noise(x0, scheduler.timesteps[1:2], noise)
    perfect = -(x_next - x) / (s_next - s)
    target = OBJECTIVE.target(x0, noise, s.reshape(1))
    assert torch.nn.functional.mse_loss(perfect, target) < 1e-10
    assert torch.nn.functional.mse_loss(-perfect, target) > 1.0
    # and a scheduler step with the pipeline's negation lands on x_next, then on x0 at sigma 0
    step = scheduler.step(-target, scheduler.timesteps[0], x).prev_sample
    assert torch.allclose(step, x_next, atol=1e-5)
    final = scheduler.step(-target, scheduler.timesteps[1], step).prev_sample
    assert torch.allclose(final, x0, atol=1e-5)
    assert torch.allclose(x + s * target, x0, atol=1e-5)  # x0 = x_t - sigma * velocity
    assert OBJECTIVE.prediction(target, x, s.reshape(1)) is target  # the raw output as it is


def test_default_sigma_draw_is_musubi_shift_two():
    options = DRAW.options(None)
    assert (options.timestep_sampling, options.discrete_flow_shift) == ("shift", 2.0)
    assert (options.weighting_scheme, options.model_prediction_type) == ("none", "raw")
    z = torch.tensor([-2.0, 0.0, 0.5, 3.0])
    u = torch.tensor([0.9, 0.1, 0.5, 0.3])
    draws = type("Draws", (), {"time_normal": z, "time_uniform": u})()
    drawn = OBJECTIVE.levels(draws, (4, 16, 8, 8))
    s = 1 / (1 + torch.exp(-z))
    assert torch.allclose(drawn, 2 * s / (1 + s), atol=1e-7)
    given = type("Flow", (), {"timestep_sampling": "uniform"})()
    uniform = ZImageFlowObjective(DRAW.options(given)).levels(draws, (4, 16, 8, 8))
    assert torch.equal(uniform, u)
    assert DRAW.options(given).discrete_flow_shift == 2.0
    assert FlowOptions().timestep_sampling != "shift"  # the defaults are Z-Image's, not kohya's


def test_dynamic_shift_mu_is_ignored_by_the_released_schedulers():
    from diffusers import FlowMatchEulerDiscreteScheduler
    from diffusers.pipelines.z_image.pipeline_z_image import calculate_shift

    scheduler = FlowMatchEulerDiscreteScheduler(**scheduler_config("base"))
    base = torch.linspace(1.0, 1 / 4, 4).tolist()
    runs = []
    for seq_len in (16, 4096):  # a tiny and a 1024-pixel image
        scheduler.set_timesteps(sigmas=base, mu=calculate_shift(seq_len))
        runs.append(scheduler.sigmas.clone())
    assert torch.equal(runs[0], runs[1])
    assert torch.equal(runs[0], sampling_sigmas(4, shift=6.0))
