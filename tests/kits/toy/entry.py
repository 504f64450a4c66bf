"""Toy's registry entry: the line a real family adds to library/models/families/registry.py's
FAMILIES (tests register it with ``registry.registered(TOY_ENTRY)``)."""

from __future__ import annotations

from library.models.families.family_entry import FamilyEntry, KohyaVocabulary
from library.models.families.spec_loader import claimer
from library.models.families.transformer_entry import DIT_OPTIONS
from tests.kits.toy.spec import SPEC

# The [flow] keys Toy reads: its single files' component files and T5's tokenizer, and the
# flow-matching draw and loss.
FLOW_KEYS = frozenset(
    {"t5xxl", "ae", "t5_tokenizer_path", "timestep_sampling", "sigmoid_scale",
     "discrete_flow_shift", "model_prediction_type", "weighting_scheme", "logit_mean",
     "logit_std", "mode_scale"}
)  # fmt: skip


def _family() -> type:
    from tests.kits.toy.family import ToyFamily

    return ToyFamily


def _load(model, flow, weight_dtype, vae_dtype):
    from tests.kits.toy.family import load_toy

    return load_toy(model, flow, weight_dtype, vae_dtype)


TOY_ENTRY = FamilyEntry(
    name="toy",
    label="Toy",
    models="Toy",
    lines=("Toy",),
    family=_family,
    claims=claimer(SPEC),
    load=_load,
    network_module="networks.lora",
    flow_matching=True,
    flow_keys=FLOW_KEYS,
    kohya=KohyaVocabulary(options=DIT_OPTIONS),
)
