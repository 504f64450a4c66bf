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

from library.config.flow_schema import FlowSection
from library.config.schema import ModelSection

Load = Callable[[ModelSection, FlowSection, torch.dtype, torch.dtype], object]


@dataclass(frozen=True)
class FamilyLoader:
    """``claims(model, flow)``: this loader reads the model (a cheap look at its files);
    ``load(model, flow, weight_dtype, vae_dtype)`` returns its Components."""

    name: str
    claims: Callable[[ModelSection, FlowSection], bool]
    load: Load


def _flux_claims(model: ModelSection, flow: FlowSection) -> bool:
    from library.models.families.flux_load import claims_flux

    return claims_flux(model, flow)


def _flux_load(model, flow, weight_dtype, vae_dtype):
    from library.models.families.flux_load import load_flux

    return load_flux(model, flow, weight_dtype, vae_dtype)


def _sd_load(model, flow, weight_dtype, vae_dtype):
    from library.models.families.sd_load import load_sd

    return load_sd(model, weight_dtype, vae_dtype)


# In the order they are asked; the last claims everything.
LOADERS: tuple[FamilyLoader, ...] = (
    FamilyLoader("flux", _flux_claims, _flux_load),
    FamilyLoader("sd", lambda model, flow: True, _sd_load),
)


def loader_for(model: ModelSection, flow: FlowSection) -> Load:
    """The load function of the first family that claims ``model``."""
    for loader in LOADERS:
        if loader.claims(model, flow):
            return loader.load
    raise AssertionError("the SD loader claims every model")
