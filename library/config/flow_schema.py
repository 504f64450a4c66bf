"""The [flow] section: flow-matching models' options in kohya's vocabulary.

Every key is unset by default. A flow-matching model fills the unset ones with kohya's defaults
(library.training.objectives.FlowOptions). The section is composed: the keys of the
flow-matching draw and loss are defined here, and every other key by the family that owns it
(its entry's ``config_keys``: its component files and its own training options, in its
package); model_version is shared, its values the families' (their entries'
``model_versions``), as are the timestep_sampling values a family names after itself (its
``timestep_draws``). Which family reads which key is its entry's ``flow_keys``: a family
refuses a set key it does not read, naming the families that do, since it would change nothing
there.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from library.config.section import Section
from library.models.families.registry import FAMILIES

SHARED_DRAWS = ("sigma", "uniform", "sigmoid", "shift", "flux_shift", "qwen_shift")
# The draws a family names after itself (musubi-tuner's), taken here and refused by the others
_OWN_DRAWS = {draw: entry.label for entry in FAMILIES for draw in entry.timestep_draws}
TimestepSampling = Literal[(*SHARED_DRAWS, *_OWN_DRAWS)]  # type: ignore[valid-type]
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
        "resolution-dependent shift with mu from 0.5 at 256 image tokens to 0.9 at 8192)"
        + "".join(f", {draw} ({label} only: musubi-tuner's)" for draw, label in _OWN_DRAWS.items())
        + ". Unset: sigma, or the family's own default draw.",
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


# musubi-tuner's --model_version values of each family that reads them (its entry's)
_VERSIONS = {entry.label: entry.model_versions for entry in FAMILIES if entry.model_versions}
ModelVersion = Literal[tuple(dict.fromkeys(v for own in _VERSIONS.values() for v in own))]  # type: ignore[valid-type]


class ModelVersionKeys(Section):
    """musubi-tuner's --model_version, read by the families whose files do not say it all."""

    model_version: ModelVersion | None = Field(
        None,
        description="Which release of the model its files are (musubi-tuner's --model_version): "
        + "; ".join(
            f"{label}: " + ", ".join(f"{value} ({words})" for value, words in own.items())
            for label, own in _VERSIONS.items()
        )
        + ". Checked against the files before any weight is read (a folder's model_index.json, "
        "a file's sizes or header must agree); it says what they do not (whether a transformer "
        "file is an edit or a distilled release). Unset: what the files say.",
    )


def _compose() -> type[Section]:
    """The [flow] section: each registered family's keys (in registry order), then the shared
    ones. A key two families define differently is a mistake in the family packages, refused
    when this module is imported."""
    owners: dict[str, type[Section]] = {
        **dict.fromkeys(FlowMatchingKeys.model_fields, FlowMatchingKeys),
        **dict.fromkeys(ModelVersionKeys.model_fields, ModelVersionKeys),
    }
    parts: list[type[Section]] = []
    for entry in FAMILIES:
        for keys in entry.config_keys:
            if keys in parts:  # shared by several families (transformer_keys.py)
                continue
            for name in keys.model_fields:
                if name in owners:
                    raise TypeError(
                        f"[flow] key {name} is defined by both {owners[name].__name__} and "
                        f"{keys.__name__} ({entry.name}); define it once"
                    )
                owners[name] = keys
            parts.append(keys)
    # pydantic lists the fields of the bases from the last to the first
    return type(
        "FlowSection",
        (FlowMatchingKeys, ModelVersionKeys, *reversed(parts)),
        {"__module__": __name__, "__doc__": "The flow-matching families' component files and "
         "training options."},
    )


FlowSection = _compose()
