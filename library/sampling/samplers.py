"""Sampler names users know (kohya's) mapped to diffusers schedulers built from the model's config."""

from __future__ import annotations

import importlib.util
import logging
import typing
import warnings

from library.config.sampling_schema import SamplerName
from library.config.suggest import nearest
from library.errors import ConfigError

log = logging.getLogger(__name__)

SAMPLER_NAMES: tuple[str, ...] = typing.get_args(SamplerName)

# name -> (diffusers scheduler class, extra config). The k_ names are kohya's aliases.
_SAMPLERS: dict[str, tuple[str, dict]] = {
    "ddim": ("DDIMScheduler", {}),
    # As SD's released pipelines ship it; the Runge-Kutta warm-up also fails below ~4 steps.
    "pndm": ("PNDMScheduler", {"skip_prk_steps": True}),
    "lms": ("LMSDiscreteScheduler", {}),
    "euler": ("EulerDiscreteScheduler", {}),
    "euler_a": ("EulerAncestralDiscreteScheduler", {}),
    "heun": ("HeunDiscreteScheduler", {}),
    "dpm_2": ("KDPM2DiscreteScheduler", {}),
    "dpm_2_a": ("KDPM2AncestralDiscreteScheduler", {}),
    # First-order-final "dpmsolver" cannot end on sigma 0; diffusers refuses the default there.
    "dpmsolver": (
        "DPMSolverMultistepScheduler",
        {"algorithm_type": "dpmsolver", "final_sigmas_type": "sigma_min"},
    ),
    "dpmsolver++": ("DPMSolverMultistepScheduler", {"algorithm_type": "dpmsolver++"}),
    # diffusers switches this on itself (with a warning) when the last sigma is zero.
    "dpmsingle": ("DPMSolverSinglestepScheduler", {"lower_order_final": True}),
}
for _name in ("lms", "euler", "euler_a", "dpm_2", "dpm_2_a"):
    _SAMPLERS[f"k_{_name}"] = _SAMPLERS[_name]
assert set(_SAMPLERS) == set(SAMPLER_NAMES), "sampler table and SamplerName disagree"


# Latents are not bounded to [-1, 1], and SD's and SDXL's released scheduler configs turn both
# off; a config written for another class (SDXL's Euler one) may leave them out, and DDIM's own
# defaults would then clip the predicted x0 and change the last step.
_LATENT_DEFAULTS = {"clip_sample": False, "set_alpha_to_one": False}

# diffusers' LMS scheduler integrates its coefficients with scipy, an optional dependency.
_NEEDS_SCIPY = ("LMSDiscreteScheduler",)


def check_sampler(name: object, where: str) -> str:
    """``name`` if it is a usable sampler, else ConfigError naming ``where`` and the fix."""
    if isinstance(name, str) and name in _SAMPLERS:
        if _SAMPLERS[name][0] in _NEEDS_SCIPY and importlib.util.find_spec("scipy") is None:
            raise ConfigError(
                f'{where}: sampler "{name}" needs the scipy package; pip install scipy or '
                'choose another sampler (e.g. "euler")'
            )
        return name
    guess = nearest(str(name).lower(), SAMPLER_NAMES) if isinstance(name, str) else None
    hint = f'did you mean "{guess}"?' if guess else "known: " + ", ".join(SAMPLER_NAMES)
    raise ConfigError(f"{where}: unknown sampler {name!r}; {hint}")


def supports_zero_terminal_snr(name: str) -> bool:
    """The sampler's diffusers class can rescale its betas to zero terminal SNR."""
    import inspect

    import diffusers

    cls = getattr(diffusers, _SAMPLERS[name][0])
    return "rescale_betas_zero_snr" in inspect.signature(cls.__init__).parameters


def check_zero_terminal_snr(name: str, where: str) -> None:
    """ConfigError when a model trained with zero_terminal_snr would be sampled by ``name``."""
    if not supports_zero_terminal_snr(name):
        usable = [n for n in SAMPLER_NAMES if supports_zero_terminal_snr(n)]
        raise ConfigError(
            f'{where}: sampler "{name}" cannot use the zero_terminal_snr noise schedule; '
            f"choose one of {', '.join(usable)}"
        )


# The sampler of a prompt that names none (None), for DDPM models.
DEFAULT_SAMPLER = "ddim"


def build_sampler(name: str | None, scheduler_config: dict, prediction_type: str):
    """A fresh diffusers scheduler for sampler ``name`` (None: ``DEFAULT_SAMPLER``).

    ``scheduler_config`` is the model's (its noise schedule: betas, timestep count, offsets);
    ``prediction_type`` is the family's ("epsilon" or "v_prediction"), which wins over the
    config so a v-prediction model samples as one. Keys a scheduler class does not know are
    ignored by diffusers' from_config; a zero-terminal-SNR schedule (rescale_betas_zero_snr)
    is refused by samplers that cannot apply it, and samples with "trailing" timesteps.
    """
    import diffusers

    name = DEFAULT_SAMPLER if name is None else name
    class_name, extra = _SAMPLERS[check_sampler(name, "sample_sampler")]
    cls = getattr(diffusers, class_name)
    config = {k: v for k, v in dict(scheduler_config).items() if not k.startswith("_")}
    for key, value in _LATENT_DEFAULTS.items():
        config.setdefault(key, value)
    config.update(extra, prediction_type=prediction_type)
    if config.get("rescale_betas_zero_snr"):
        check_zero_terminal_snr(name, "sample_sampler")
        # Start from the pure-noise timestep, as zero terminal SNR intends (Lin et al. 2023).
        config["timestep_spacing"] = "trailing"
    with warnings.catch_warnings():
        # "dpmsolver" is deprecated upstream in favour of "dpmsolver++"; users still ask for it.
        warnings.simplefilter("ignore", FutureWarning)
        return cls.from_config(config)


# The samplers of a flow-matching model (Flux.1, SD3): its Euler sampler, under both of kohya's
# names.
FLOW_SAMPLER_NAMES: tuple[str, ...] = ("euler", "k_euler")
_warned_flow_samplers: set[str] = set()


def build_flow_sampler(name: str | None, scheduler_config: dict):
    """A fresh FlowMatchEulerDiscreteScheduler from the model's sampling ``scheduler_config``
    (its shift and dynamic-shifting keys) for sampler ``name`` (None: Euler).

    Only Euler samples a flow-matching model: diffusers' DDPM samplers integrate a noise
    schedule such a model does not have. sd-scripts samples Flux.1 and SD3 with Euler whatever
    sample_sampler says, and GUIs write their SD default ("euler_a") into those configs, so an
    SD sampler name is sampled with Euler, with a warning (once per name).
    """
    from diffusers import FlowMatchEulerDiscreteScheduler

    if name is not None and name not in FLOW_SAMPLER_NAMES and name not in _warned_flow_samplers:
        _warned_flow_samplers.add(name)
        log.warning(
            'sample_sampler "%s": a flow-matching model samples with Euler only, as sd-scripts '
            'does; sampling with "euler"',
            name,
        )
    config = {k: v for k, v in dict(scheduler_config).items() if not k.startswith("_")}
    return FlowMatchEulerDiscreteScheduler.from_config(config)
