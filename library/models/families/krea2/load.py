"""Reading Krea 2: its folders and single files as spec.py declares them, read by the shared
loader (library/models/families/spec_loader.py), which checks every header, shape and weights
file before anything loads; nothing is downloaded. RAW or Turbo: the folder's model_index.json
is_distilled, or [flow] dit_variant for a file."""

from __future__ import annotations

import logging

import torch

from library.config.flow_section import FlowSection
from library.config.model_schema import ModelSection
from library.models.components import Components
from library.models.families.krea2.family import TURBO, TURBO_KEY, krea2_family
from library.models.families.krea2.keys import TABLE
from library.models.families.krea2.spec import (
    DRAW,
    PATCH,
    SPEC,
    Krea2FlowObjective,
    claims_krea2,
    scheduler_config,
)
from library.models.families.sampling_weights import check_same_weights
from library.models.families.spec_loader import components, folder_scheduler, load_spec

__all__ = ["claims_krea2", "load_krea2"]
log = logging.getLogger(__name__)


def load_krea2(
    model: ModelSection, flow: FlowSection, weight_dtype: torch.dtype, vae_dtype: torch.dtype
) -> Components:
    """Krea 2's Components (frozen, on the CPU); ModelError for any problem with the files."""
    loaded = load_spec(SPEC, model, flow, weight_dtype, vae_dtype)
    facts = loaded.facts
    if facts.distilled:  # training the distilled Turbo collapses its few-step sampling
        log.warning(
            "Krea 2: the model is the distilled Turbo checkpoint; LoRAs are trained on Krea 2 "
            "RAW (krea/Krea-2-Raw) and applied to Turbo at inference. Training Turbo itself "
            "loses its 8-step sampling"
        )
    if flow.turbo_dit:
        check_same_weights(TURBO_KEY, flow.turbo_dit, TURBO, TABLE, loaded.modules["transformer"])
    scheduler = folder_scheduler(loaded.model_dir, scheduler_config())
    objective = Krea2FlowObjective(DRAW.options(flow), scheduler, patch=PATCH)
    return components(
        SPEC, loaded, objective, krea2_family(facts.taps, facts.distilled, flow.turbo_dit)
    )
