"""The [flow] section as the code below the family registry knows it: flow-matching models'
options in kohya's vocabulary.

Every key is unset by default. A flow-matching model fills the unset ones with kohya's defaults
(library.training.objectives.FlowOptions). The keys of the flow-matching draw and loss are
defined here; every other key by the family that owns it (its entry's ``config_keys``, in its
package). config.flow_schema composes the section a config holds from this one and those, in
registry order; the families and the shared loaders, which the registry lists, receive it as
the FlowSection below and read their own keys from it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import ClassVar, Literal, Protocol

from pydantic import Field

from library.config.section import Section

# The draws every flow-matching family takes; a family may add draws named after it
# (its entry's timestep_draws), which config.flow_schema's composed section adds to the key.
SHARED_DRAWS = ("sigma", "uniform", "sigmoid", "shift", "flux_shift", "qwen_shift")
TimestepSampling = Literal[SHARED_DRAWS]  # type: ignore[valid-type]
WeightingScheme = Literal["sigma_sqrt", "logit_normal", "mode", "cosmap", "none", "uniform"]
ModelPredictionType = Literal["raw", "additive", "sigma_scaled"]


class FlowMatchingKeys(Section):
    """How the noise level is drawn and the prediction compared with the target."""

    timestep_sampling: TimestepSampling | None = Field(
        None,
        description="How each sample's noise level sigma is drawn: sigma (an index into the "
        "shifted 1000-step schedule, by weighting_scheme), uniform, sigmoid (sigmoid of "
        "sigmoid_scale * normal), shift (sigmoid, then discrete_flow_shift), flux_shift (sigmoid, "
        "then Flux's resolution-dependent shift), qwen_shift (musubi-tuner's: sigmoid, then a "
        "resolution-dependent shift with mu from 0.5 at 256 image tokens to 0.9 at 8192). Unset: sigma, or the family's own default draw.",
    )
    sigmoid_scale: float | None = Field(
        None,
        gt=0,
        description="Scale of the normal draw in sigmoid/shift/flux_shift/qwen_shift. Unset: 1.",
    )
    discrete_flow_shift: float | None = Field(
        None,
        gt=0,
        description="Shift s of sigma -> s*sigma / (1 + (s-1)*sigma) for timestep_sampling shift "
        "and of the sigma schedule. Unset: 3.",
    )
    model_prediction_type: ModelPredictionType | None = Field(
        None,
        description="How the transformer's output is compared with the velocity target: raw "
        "(as is), additive (plus the noisy input), sigma_scaled (noisy input - sigma * output, "
        "weighted by weighting_scheme). Unset: sigma_scaled, kohya's default; kohya's docs "
        "recommend raw for Flux.1.",
    )
    weighting_scheme: WeightingScheme | None = Field(
        None,
        description="Density of the sigma draw (Flux.1's timestep_sampling sigma, and SD3: "
        "logit_normal, mode, uniform) and loss weight of sigma_scaled and SD3 (sigma_sqrt, "
        "cosmap). Unset: uniform.",
    )
    logit_mean: float | None = Field(
        None, description="Mean of weighting_scheme logit_normal. Unset: 0."
    )
    logit_std: float | None = Field(
        None, gt=0, description="Standard deviation of weighting_scheme logit_normal. Unset: 1."
    )
    mode_scale: float | None = Field(
        None, description="Scale of weighting_scheme mode. Unset: 1.29."
    )


class KeyReader(Protocol):
    """A family that reads a [flow] key, as the section knows it (its registry entry:
    library.models.families.family_entry.FamilyEntry)."""

    name: str
    label: str
    network_module: str


def _no_readers(key: str) -> tuple[KeyReader, ...]:
    return ()


def _no_owner(value: str | None) -> KeyReader | None:
    return None


def _no_versions(kind: str) -> dict[str, str]:
    return {}


class FlowSection(FlowMatchingKeys):
    """The [flow] section: the shared flow-matching keys here, and every registered family's
    own keys, which config.flow_schema's FlowSection (a subclass composed from the registry:
    what a config holds) adds. Code below the registry takes that subclass's instances as this
    type and reads the keys of its own family from them.

    What the composed subclass carries of the registry to the families, which name other
    families in their refusals: ``readers(key)``, the registered families that read ``key``
    (their entries, in registry order); ``draw_owner(value)``, the family whose own
    timestep_sampling draw ``value`` is (None for a shared draw); ``model_versions(kind)``, the
    model_version values family ``kind``'s models take, each with what it names."""

    readers: ClassVar[Callable[[str], tuple[KeyReader, ...]]] = staticmethod(_no_readers)
    draw_owner: ClassVar[Callable[[str | None], KeyReader | None]] = staticmethod(_no_owner)
    model_versions: ClassVar[Callable[[str], dict[str, str]]] = staticmethod(_no_versions)
