"""Loading FLUX.1 Kontext [dev]: which models are Kontext, and its files.

A diffusers folder says so itself (model_index.json names FluxKontextPipeline; its parts are
FLUX.1's). The distributed transformer file (flux1-kontext-dev.safetensors) has FLUX.1 dev's
names and shapes, so nothing in it tells the two apart: the config says so with kohya's
model_type = "flux_kontext", and the file is then read with its clip_l, t5xxl and ae files as
FLUX.1's are (flux/spec.py, read by the shared loader).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import torch

from library.config.flow_section import FlowSection
from library.config.model_schema import ModelSection
from library.errors import ModelError
from library.models.components import Components
from library.models.families.claims import folder_pipeline
from library.models.families.flux import spec as flux_spec
from library.models.families.flux.load import flux_components
from library.models.families.kontext.family import kontext_family
from library.models.families.kontext.sampling import PIPELINE
from library.models.families.kontext.variant import EDIT
from library.models.families.spec_loader import load_spec

MODEL_TYPE = EDIT.model_type


def kontext_variant(checked) -> str:
    """FLUX.1's look at the checked parts, and ModelError for a model without the distilled
    guidance input (schnell-shaped), which Kontext [dev] has: before any weight is read."""
    variant = flux_spec.variant_of(checked)
    if variant != "dev":
        raise ModelError(
            f"{checked.model_dir} has no distilled guidance input (a schnell-shaped transformer), "
            "and FLUX.1 Kontext [dev] has one; point pretrained_model_name_or_path at "
            "flux1-kontext-dev"
        )
    return variant


# FLUX.1's spec under Kontext's pipeline, with Kontext's look at the parts
SPEC = dataclasses.replace(
    flux_spec.SPEC, pipeline=PIPELINE, family="FLUX.1 Kontext [dev]", inspect=kontext_variant
)


def claims_kontext(model: ModelSection, flow: FlowSection) -> bool:
    """True for a FluxKontextPipeline folder, or any model the config calls Kontext
    (model_type = "flux_kontext"; the loader then checks it holds FLUX.1's parts).
    ModelError for model_type = "flux_kontext" on a text-to-image FLUX.1 folder, so the
    contradiction is named before the references Kontext would need are asked for."""
    path = Path(model.pretrained_model_name_or_path).expanduser()
    if flow.model_type == MODEL_TYPE:
        _refuse_text_to_image_folder(path)
        return True
    return path.is_dir() and folder_pipeline(path) == PIPELINE


def _refuse_text_to_image_folder(path: Path) -> None:
    if path.is_dir() and folder_pipeline(path) == flux_spec.PIPELINE:
        raise ModelError(
            f"{path} holds a text-to-image FLUX.1 ({flux_spec.PIPELINE}), not a FLUX.1 "
            f'Kontext model, and model_type = "{MODEL_TYPE}" says Kontext: remove model_type '
            "to train FLUX.1, or point pretrained_model_name_or_path at the Kontext model"
        )


def load_kontext(
    model: ModelSection, flow: FlowSection, weight_dtype: torch.dtype, vae_dtype: torch.dtype
) -> Components:
    """Components of FLUX.1 Kontext [dev] (a folder, or a transformer file with FLUX.1's
    component files), as FLUX.1's loader reads them. ModelError for any problem with the files,
    a model without the guidance input among them (``kontext_variant``)."""
    _refuse_text_to_image_folder(Path(model.pretrained_model_name_or_path).expanduser())
    loaded = load_spec(SPEC, model, flow, weight_dtype, vae_dtype)
    return flux_components(SPEC, loaded, kontext_family(flow), flow)
