"""FLUX.1 Kontext [dev]'s edit variant of FLUX.1's family (library.models.families.edit_variant):
its data, which its entry (entry.py) and its family (family.py) share, and its hooks
(hooks.py), named and imported on first use, so the entry reads without torch."""

from __future__ import annotations

from library.models.families.edit_variant import EditVariant
from library.models.families.family_entry import Deferred

LINE = "FLUX.1 Kontext"
_PACKAGE = "library.models.families.kontext"

# FLUX.1's family as Kontext: one reference image per sample, as the pipeline and musubi-tuner
# take it; kohya's model_type "flux_kontext"; its hooks in hooks.py
EDIT = EditVariant(
    entry="flux_kontext",
    label=LINE,
    reference_images=(1, 1),
    model_type="flux_kontext",
    described_as=("FLUX.1 dev", "FLUX.1 Kontext [dev]"),
    hooks=Deferred(f"{_PACKAGE}.hooks:HOOKS").get,
)
