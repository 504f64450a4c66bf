"""The training config as the code below the family registry reads it.

config.schema's Config is composed above the registry (the network_module values it takes and
the [flow] keys it holds come from the registry's entries), and the families and the shared
model code are what the registry lists; so they know a config by its sections, the ones below
the registry by their own types.
"""

from __future__ import annotations

from typing import Protocol

from library.config.flow_section import FlowSection
from library.config.model_schema import ModelSection
from library.config.section import Section


class ConfigView(Protocol):
    """A config (config.schema.Config), known by its sections."""

    model: ModelSection
    flow: FlowSection
    network: Section
    optimizer: Section
    training: Section
    data: Section
    saving: Section
    sampling: Section
    adapter: Section
    experts: Section
