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
    ``load(model, flow, weight_dtype, vae_dtype)`` returns its Components; ``family()`` the
    class of the family it loads (its class-level data, such as PIXEL_MULTIPLE, is known before
    any weight is read). ``reads_vae``: the loader itself honours [model] vae (else the shared
    loader replaces the VAE afterwards)."""

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
