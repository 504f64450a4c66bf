"""Model families: which family's loader reads a model, and the families themselves.

A family is one implementation of library.models.families.base.ModelFamily (its data and
behaviours) plus a loader that turns the user's files into Components. Each loader entry below
says which models it claims; the first that claims a model loads it. SD 1.x/2.x/SDXL claims
every model no other family claims, so its errors (missing folder, unknown checkpoint) are the
ones a user of an unrecognised model sees. A new family adds its module and one entry here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from library.config.flow_schema import FlowSection, foreign_flow_key
from library.config.schema import ModelSection
from library.errors import ConfigError

Load = Callable[[ModelSection, FlowSection, torch.dtype, torch.dtype], object]


@dataclass(frozen=True)
class FamilyLoader:
    """``claims(model, flow)``: this loader reads the model (a cheap look at its files);
    ``load(model, flow, weight_dtype, vae_dtype)`` returns its Components; ``family()`` the
    class of the family it loads (its class-level data, such as PIXEL_MULTIPLE, is known before
    any weight is read). ``reads_vae``: the loader itself honours [model] vae (else the shared
    loader replaces the VAE afterwards). ``name`` is the family's kind in the [flow] key table
    (library.config.flow_schema)."""

    name: str
    claims: Callable[[ModelSection, FlowSection], bool]
    load: Load
    family: Callable[[], type]
    reads_vae: bool = False


def _flux_claims(model: ModelSection, flow: FlowSection) -> bool:
    from library.models.families.flux_load import claims_flux

    return claims_flux(model, flow)


def _flux_load(model, flow, weight_dtype, vae_dtype):
    from library.models.families.flux_load import load_flux

    return load_flux(model, flow, weight_dtype, vae_dtype)


def _sd3_claims(model: ModelSection, flow: FlowSection) -> bool:
    from library.models.families.sd3_load import claims_sd3

    return claims_sd3(model, flow)


def _sd3_load(model, flow, weight_dtype, vae_dtype):
    from library.models.families.sd3 import load_sd3

    return load_sd3(model, flow, weight_dtype, vae_dtype)


def _flux_family() -> type:
    from library.models.families.flux import FluxFamily

    return FluxFamily


def _sd3_family() -> type:
    from library.models.families.sd3 import SD3Family

    return SD3Family


def _sd_family() -> type:
    from library.models.families.sd import SDFamily

    return SDFamily


def _sd_load(model, flow, weight_dtype, vae_dtype):
    from library.models.families.sd_load import load_sd

    return load_sd(model, weight_dtype, vae_dtype)


# In the order they are asked; the last claims everything.
LOADERS: tuple[FamilyLoader, ...] = (
    FamilyLoader("flux", _flux_claims, _flux_load, _flux_family),
    # SD3's single files may hold no VAE: the loader needs [model] vae to build one.
    FamilyLoader("sd3", _sd3_claims, _sd3_load, _sd3_family, reads_vae=True),
    FamilyLoader("sd", lambda model, flow: True, _sd_load, _sd_family),
)


def loader_for(model: ModelSection, flow: FlowSection) -> FamilyLoader:
    """The first family loader that claims ``model``."""
    for loader in LOADERS:
        if loader.claims(model, flow):
            return loader
    raise AssertionError("the SD loader claims every model")


# How messages name each loader's models, and the network_module each family's kohya trainer
# uses (the fix offered when a config names another family's).
_LABELS = {"flux": "FLUX.1", "sd3": "SD3/SD3.5", "sd": "SD 1.x/2.x/SDXL"}
_MODULES = {"flux": "networks.lora_flux", "sd3": "networks.lora_sd3", "sd": "networks.lora"}


def check_config_family(
    loader: FamilyLoader, model: ModelSection, flow: FlowSection, network_module: str | None
) -> None:
    """ConfigError, before anything loads, when the config was written for another family than
    the model ``loader`` claimed: another family's network_module or [flow] key (the loader
    would otherwise stop on a part that family does not need, or load and refuse it later)."""
    this = f"pretrained_model_name_or_path {model.pretrained_model_name_or_path} is " + _a(
        _LABELS[loader.name]
    )
    owner = next((k for k, m in _MODULES.items() if m == network_module and k != "sd"), None)
    if owner is not None and owner != loader.name:
        raise ConfigError(
            f'network_module = "{network_module}" is for {_LABELS[owner]} models, and {this} '
            f"model; point it at {_a(_LABELS[owner])} model, or use network_module = "
            f'"{_MODULES[loader.name]}"'
        )
    found = foreign_flow_key(flow, loader.name)
    if found is not None:
        key, owners = found
        names = " or ".join(_LABELS[k] for k in owners)
        raise ConfigError(
            f"{key} is {_a(names)} key, and {this} model; point it at {_a(names)} model, or "
            f"remove {key}"
        )


def _a(label: str) -> str:
    """``label`` with its article ("an SD3/SD3.5", "a FLUX.1")."""
    return f"{'an' if label.startswith('S') else 'a'} {label}"
