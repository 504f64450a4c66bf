"""Loading FLUX.1 (dev / schnell): a diffusers FluxPipeline folder, or the transformer file with
its clip_l, t5xxl and ae files, as spec.py declares them (read by the shared loader,
families/spec_loader.py)."""

from __future__ import annotations

import dataclasses

import torch

from library.config.flow_section import FlowSection
from library.config.model_schema import ModelSection
from library.models.components import Components
from library.models.families.flux import shapes as flux_shapes
from library.models.families.flux.family import flux_family
from library.models.families.flux.sampling import flux_scheduler_config
from library.models.families.flux.spec import SPEC
from library.models.families.flux.spec import claims_flux as claims_flux
from library.models.families.folder_loader import LoadedFolder
from library.models.families.spec import FamilySpec
from library.models.families.spec_loader import components, load_spec
from library.training.objectives import FlowMatchingObjective, FlowOptions


def load_flux(
    model: ModelSection, flow: FlowSection, weight_dtype: torch.dtype, vae_dtype: torch.dtype
) -> Components:
    """Components of a FLUX.1 dev or schnell model: a diffusers folder or a transformer file.

    Text encoders and tokenizers are (CLIP-L, T5). Every module is frozen, in eval mode, on the
    CPU, in ``weight_dtype`` (the AE in ``vae_dtype``). ModelError for any problem with the files.
    """
    loaded = load_spec(SPEC, model, flow, weight_dtype, vae_dtype)
    return flux_components(SPEC, loaded, flux_family(loaded.facts, flow), flow)


def flux_components(
    spec: FamilySpec, loaded: LoadedFolder, family, flow: FlowSection
) -> Components:
    """Components of a loaded FLUX.1-shaped model (``loaded.facts``: its variant) trained as
    ``family`` (which is told the transformer's block counts, so the plan shows them)."""
    config = loaded.modules[spec.denoiser.sub].config
    family = dataclasses.replace(family, blocks=(config.num_layers, config.num_single_layers))
    objective = FlowMatchingObjective(
        FlowOptions.from_section(flow),
        flux_scheduler_config(loaded.facts),
        patch=flux_shapes.PATCH_SIZE,
    )
    return components(spec, loaded, objective, family)
