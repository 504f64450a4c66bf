"""Which registered family reads a model, and whether the config was written for that family."""

from __future__ import annotations

from library.config.flow_section import FlowSection
from library.config.model_schema import ModelSection
from library.errors import ConfigError
from library.models.families.base import ModelFamily
from library.models.families.family_entry import FamilyEntry
from library.models.families.registry import (
    claim_order,
    foreign_flow_key,
    network_module_owner,
)
from library.models.families.unclaimed import unclaimed_error


def entry_for(model: ModelSection, flow: FlowSection) -> FamilyEntry:
    """The first family (in claim order) that claims ``model``: a cheap look at its files.
    ModelError saying what the model is when no family claims it."""
    for entry in claim_order():
        if entry.claims(model, flow):
            return entry
    raise unclaimed_error(model.pretrained_model_name_or_path)


def check_config_family(
    entry: FamilyEntry, model: ModelSection, flow: FlowSection, network_module: str | None
) -> None:
    """ConfigError, before anything loads, when the config was written for another family than
    the one that claimed the model (``entry``): another family's network_module or [flow] key
    (the loader would otherwise stop on a part that family does not need, or load and refuse it
    later)."""
    this = (
        f"pretrained_model_name_or_path {model.pretrained_model_name_or_path} is {entry.a_models}"
    )
    owner = network_module_owner(network_module)
    # a module several families' trainers share (kohya's lora_flux) is each one's own
    if owner is not None and owner is not entry and network_module != entry.network_module:
        raise ConfigError(
            f'network_module = "{network_module}" is for {owner.models} models, and {this} '
            f"model; point it at {owner.a_models} model, or use network_module = "
            f'"{entry.network_module}"'
        )
    found = foreign_flow_key(flow, entry.name)
    if found is not None:
        key, owners = found
        names = " or ".join(owner.models for owner in owners)
        article = owners[0].article if owners else "a"
        raise ConfigError(
            f"{key} is {article} {names} key, and {this} model; point it at {article} {names} "
            f"model, or remove {key}"
        )


def check_network_module(family: ModelFamily, module: str) -> None:
    """ConfigError when the run's network_module ``module`` is none that the loaded ``family``
    trains with (its ``network_modules``), naming the family it is for."""
    if module not in family.network_modules:
        owner = network_module_owner(module)
        owned = owner.label if owner is not None else "another model family"
        raise ConfigError(
            f'network_module = "{module}" is for {owned} and this is a {family.name} model; '
            f'use "{family.network_modules[-1]}"'
        )
