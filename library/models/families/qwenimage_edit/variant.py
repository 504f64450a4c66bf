"""Qwen-Image-Edit's edit variants of Qwen-Image's family
(library.models.families.edit_variant): their data, which their entries (entry.py) and their
family (family.py) share, and their hooks (hooks.py), named and imported on first use, so the
entries read without torch."""

from __future__ import annotations

from dataclasses import replace

from library.models.families.edit_variant import EditVariant
from library.models.families.family_entry import Deferred

LINE = "Qwen-Image-Edit"
PLUS_LINE = "Qwen-Image-Edit-2509/2511"
_PACKAGE = "library.models.families.qwenimage_edit"

# Qwen-Image's family as Qwen-Image-Edit: one reference image per sample, which Qwen2.5-VL reads
# with the caption; its hooks in hooks.py
EDIT = EditVariant(
    entry="qwenimage_edit",
    label=LINE,
    reference_images=(1, 1),
    text_reads_references=True,
    described_as=("Qwen-Image", LINE),
    hooks=Deferred(f"{_PACKAGE}.hooks:HOOKS").get,
)
# Qwen-Image-Edit-2509 and 2511 (QwenImageEditPlusPipeline): one or more references
PLUS_EDIT = replace(
    EDIT,
    entry="qwenimage_edit_plus",
    label="Qwen-Image-Edit-2509",
    reference_images=(1, None),
    described_as=("Qwen-Image", PLUS_LINE),
    hooks=Deferred(f"{_PACKAGE}.hooks:PLUS_HOOKS").get,
)
