"""The [flow] section a config holds, composed from the registered families' keys.

The shared flow-matching keys and the type the code below the registry knows the section by are
library.config.flow_section's; every other key is defined by the family that owns it (its
entry's ``config_keys``: its component files and its own training options, in its package).
model_version is shared, its values the families' (their entries' ``model_versions``), as are
the timestep_sampling values a family names after itself (its ``timestep_draws``). Which family
reads which key is its entry's ``flow_keys``: a family refuses a set key it does not read,
naming the families that do, since it would change nothing there.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from library.config import flow_section
from library.config.section import Section
from library.models.families.registry import FAMILIES, draw_owner, family_entry, flow_key_owners

# The draws a family names after itself (musubi-tuner's), taken here and refused by the others
_OWN_DRAWS = {draw: entry.label for entry in FAMILIES for draw in entry.timestep_draws}
TimestepSampling = Literal[(*flow_section.SHARED_DRAWS, *_OWN_DRAWS)]  # type: ignore[valid-type]


class DrawKeys(Section):
    """timestep_sampling with the registered families' own draws added to the shared ones."""

    timestep_sampling: TimestepSampling | None = Field(
        None,
        description=flow_section.FlowMatchingKeys.model_fields["timestep_sampling"]
        .description.removesuffix(". Unset: sigma, or the family's own default draw.")
        + "".join(f", {draw} ({label} only: musubi-tuner's)" for draw, label in _OWN_DRAWS.items())
        + ". Unset: sigma, or the family's own default draw.",
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
        **dict.fromkeys(flow_section.FlowSection.model_fields, flow_section.FlowMatchingKeys),
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
        (DrawKeys, flow_section.FlowSection, ModelVersionKeys, *reversed(parts)),
        {
            "__module__": __name__,
            "__doc__": "The flow-matching families' component files and training options.",
            "readers": staticmethod(flow_key_owners),
            "draw_owner": staticmethod(draw_owner),
            "model_versions": staticmethod(lambda kind: family_entry(kind).model_versions),
        },
    )


FlowSection = _compose()
