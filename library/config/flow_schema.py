"""The [flow] section a config holds, composed from the registered families' keys.

The shared flow-matching keys and the type the code below the registry knows the section by are
library.config.flow_section's; every other key is defined by the family that owns it (its
entry's ``config_keys``: its component files and its own training options, in its package).
Which family reads which key is its entry's ``flow_keys``: a family refuses a set key it does
not read, naming the families that do, since it would change nothing there.
"""

from __future__ import annotations

from library.config import flow_section
from library.config.section import Section
from library.models.families.registry import FAMILIES, flow_key_owners


def _compose() -> type[Section]:
    """The [flow] section: each registered family's keys (in registry order), then the shared
    ones. A key two families define differently is a mistake in the family packages, refused
    when this module is imported."""
    owners: dict[str, type[Section]] = dict.fromkeys(
        flow_section.FlowSection.model_fields, flow_section.FlowMatchingKeys
    )
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
        (flow_section.FlowSection, *reversed(parts)),
        {
            "__module__": __name__,
            "__doc__": "The flow-matching families' component files and training options.",
            "readers": staticmethod(flow_key_owners),
        },
    )


FlowSection = _compose()
