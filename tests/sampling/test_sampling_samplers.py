"""Sampler names build the diffusers scheduler users expect, on the model's own noise schedule."""

from __future__ import annotations

import importlib.util
import typing

import pytest
import torch

from library.config.sampling_schema import SamplerName, SamplingSection
from library.errors import ConfigError
from library.sampling.samplers import SAMPLER_NAMES, build_sampler, check_sampler
from tests.kits.sd.tiny import tiny_scheduler_config

# kohya's names and the diffusers classes they stand for, written out by hand.
EXPECTED = {
    "ddim": "DDIMScheduler",
    "pndm": "PNDMScheduler",
    "lms": "LMSDiscreteScheduler",
    "k_lms": "LMSDiscreteScheduler",
    "euler": "EulerDiscreteScheduler",
    "k_euler": "EulerDiscreteScheduler",
    "euler_a": "EulerAncestralDiscreteScheduler",
    "k_euler_a": "EulerAncestralDiscreteScheduler",
    "heun": "HeunDiscreteScheduler",
    "dpm_2": "KDPM2DiscreteScheduler",
    "k_dpm_2": "KDPM2DiscreteScheduler",
    "dpm_2_a": "KDPM2AncestralDiscreteScheduler",
    "k_dpm_2_a": "KDPM2AncestralDiscreteScheduler",
    "dpmsolver": "DPMSolverMultistepScheduler",
    "dpmsolver++": "DPMSolverMultistepScheduler",
    "dpmsingle": "DPMSolverSinglestepScheduler",
}
HAS_SCIPY = importlib.util.find_spec("scipy") is not None
LMS = ("lms", "k_lms")


def scaled_linear_alphas_cumprod() -> torch.Tensor:
    """SD's schedule: betas linear in sqrt between 0.00085 and 0.012 over 1000 steps."""
    betas = torch.linspace(0.00085**0.5, 0.012**0.5, 1000, dtype=torch.float64) ** 2
    return torch.cumprod(1 - betas, dim=0)


def test_every_kohya_name_is_known():
    assert set(SAMPLER_NAMES) == set(EXPECTED)
    assert set(typing.get_args(SamplerName)) == set(EXPECTED)
    # unset: the model's default, kohya's ddim for SD (build_sampler(None, ...) is DDIM)
    assert SamplingSection().sample_sampler is None


USABLE = sorted(set(EXPECTED) - (set() if HAS_SCIPY else set(LMS)))


@pytest.mark.parametrize(
    ("name", "prediction"),
    [(name, "v_prediction") for name in USABLE] + [("ddim", "epsilon"), ("euler_a", "epsilon")],
)
def test_sampler_class_schedule_and_prediction_type(name, prediction):
    config = tiny_scheduler_config("sd1")  # the folder's config says epsilon
    scheduler = build_sampler(name, config, prediction)
    assert type(scheduler).__name__ == EXPECTED[name]
    # The family's prediction type wins over the folder's, so v-models sample as v-models.
    assert scheduler.config.prediction_type == prediction
    assert torch.allclose(
        scheduler.alphas_cumprod.double(), scaled_linear_alphas_cumprod(), atol=1e-6
    )
    scheduler.set_timesteps(2)  # the sample tests use 2 steps; every sampler must accept them
    assert len(scheduler.timesteps) >= 2


def test_dpmsolver_variants():
    config = tiny_scheduler_config("sd1")
    assert build_sampler("dpmsolver", config, "epsilon").config.algorithm_type == "dpmsolver"
    assert build_sampler("dpmsolver++", config, "epsilon").config.algorithm_type == "dpmsolver++"


def test_each_call_builds_a_fresh_scheduler():
    config = tiny_scheduler_config("sd1")
    a, b = build_sampler("euler", config, "epsilon"), build_sampler("euler", config, "epsilon")
    a.set_timesteps(3)
    assert a is not b and b.num_inference_steps is None


def test_unknown_sampler_names_the_nearest():
    with pytest.raises(
        ConfigError, match=r"^here: unknown sampler 'Euler_A'; did you mean \"euler_a\"\?$"
    ):
        check_sampler("Euler_A", "here")
    with pytest.raises(ConfigError, match="unknown sampler 'zzz'; known: ddim, pndm"):
        check_sampler("zzz", "here")


@pytest.mark.parametrize("name", LMS)
def test_lms_without_scipy_is_a_clear_error(name, monkeypatch):
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda mod, *a: None if mod == "scipy" else real_find_spec(mod, *a)
    )
    with pytest.raises(ConfigError, match=f'sampler "{name}" needs the scipy package'):
        check_sampler(name, "sample_sampler")


ZERO_SNR_OK = ["ddim", "euler", "euler_a", "dpmsolver", "dpmsolver++", "k_euler", "k_euler_a"]


def test_zero_terminal_snr_schedule_reaches_the_samplers():
    from diffusers import DDPMScheduler

    config = dict(tiny_scheduler_config("sd2-v"), rescale_betas_zero_snr=True)
    training = DDPMScheduler.from_config(config)  # what the trainer trains against
    assert training.alphas_cumprod[-1] == 0
    for name in ZERO_SNR_OK:
        scheduler = build_sampler(name, config, "v_prediction")
        # The same rescaled schedule (diffusers nudges the exact 0 at the end to 2**-24) ...
        assert torch.allclose(scheduler.alphas_cumprod[:-1], training.alphas_cumprod[:-1])
        assert scheduler.alphas_cumprod[-1] <= 2**-24
        # ... sampled from the pure-noise timestep ("trailing" spacing).
        scheduler.set_timesteps(2)
        assert int(scheduler.timesteps[0]) == 999


@pytest.mark.parametrize("name", sorted(set(USABLE) - set(ZERO_SNR_OK)))
def test_samplers_without_zero_terminal_snr_are_refused(name):
    config = dict(tiny_scheduler_config("sd2-v"), rescale_betas_zero_snr=True)
    with pytest.raises(ConfigError, match=f'sampler "{name}" cannot use the zero_terminal_snr'):
        build_sampler(name, config, "v_prediction")
