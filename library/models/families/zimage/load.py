"""Loading Z-Image: its folders and single files as spec.py declares them, read by the shared
loader (library/models/families/spec_loader.py), which checks every header, shape and weights
file before anything loads; nothing is downloaded."""

from __future__ import annotations

import torch

from library.config.flow_section import FlowSection
from library.config.model_schema import ModelSection
from library.models.components import Components
from library.models.families.spec_loader import components, load_spec
from library.models.families.zimage.family import variant_of_shift, zimage_family
from library.models.families.zimage.objective import DRAW, ZImageFlowObjective
from library.models.families.zimage.spec import SPEC


def load_zimage(
    model: ModelSection, flow: FlowSection, weight_dtype: torch.dtype, vae_dtype: torch.dtype
) -> Components:
    """Components of Z-Image as a diffusers folder or single files: the transformer, FLUX.1's
    AE, Qwen3 and its tokenizer, frozen, in eval mode, on the CPU, in ``weight_dtype`` (the AE
    in ``vae_dtype``). ModelError for any problem with the files."""
    loaded = load_spec(SPEC, model, flow, weight_dtype, vae_dtype)
    shift = float(loaded.facts.get("shift", 1.0))  # facts: the variant's scheduler config
    objective = ZImageFlowObjective(DRAW.options(flow), loaded.facts)
    return components(SPEC, loaded, objective, zimage_family(variant_of_shift(shift), shift))
