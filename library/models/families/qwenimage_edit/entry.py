"""Qwen-Image-Edit's entry in the family registry: what shared code asks of it before loading
it. Its transformer, files, keys and LoRA layout are Qwen-Image's (qwenimage/entry.py); what
differs is its folder (QwenImageEditPipeline, with processor/) and that each training image
comes with its reference image, which Qwen2.5-VL reads with the caption: an edit variant of
Qwen-Image's family (library.models.families.edit_variant), not a family class of its own.

Readable without torch or diffusers: the loader and the hooks are named and imported on first
use."""

from __future__ import annotations

from dataclasses import replace

from library.models.families.family_entry import Deferred, FamilyEntry, KohyaVocabulary, ToolFacts
from library.models.families.qwenimage.entry import QWENIMAGE
from library.models.families.qwenimage_edit.variant import EDIT, LINE, PLUS_EDIT, PLUS_LINE

_PACKAGE = "library.models.families.qwenimage_edit"

QWENIMAGE_EDIT = FamilyEntry(
    name=EDIT.entry,
    label=EDIT.label,
    models=LINE,
    lines=(LINE,),
    family=QWENIMAGE.family,
    edit=EDIT,
    claims=Deferred(f"{_PACKAGE}.load:claims_qwenimage_edit"),
    # its folder's transformer is Qwen-Image's, which Qwen-Image's claim takes
    claims_within=QWENIMAGE.name,
    file_setting='model_version = "edit"',
    load=Deferred(f"{_PACKAGE}.load:load_qwenimage_edit"),
    reads_vae=True,
    # musubi-tuner trains the edit model with its Qwen-Image LoRA module
    network_module=QWENIMAGE.network_module,
    flow_matching=True,
    flow_keys=QWENIMAGE.flow_keys,
    # musubi-tuner's older dataset keys of its Qwen-Image-Edit trainer, which mean the general
    # ones
    kohya=KohyaVocabulary(
        aliases={
            "qwen_image_edit_no_resize_control": "no_resize_control",
            "qwen_image_edit_control_resolution": "control_resolution",
        }
    ),
    # its LoRA files are Qwen-Image's (the same transformer and names): one line to the file
    # checks, whose marks Qwen-Image's entry names
    tool=ToolFacts(
        variant_labels={"qwenimage-edit": LINE},
        line_of=lambda family: QWENIMAGE.lines[0],
        own_layout=QWENIMAGE.tool.own_layout,
        comfy_model_name=QWENIMAGE.tool.comfy_model_name,
        comfy_keys=QWENIMAGE.tool.comfy_keys,
        layout_names=QWENIMAGE.tool.layout_names,
    ),
)

# Qwen-Image-Edit-2509 and 2511 (QwenImageEditPlusPipeline): the same parts and files, one or
# more references per sample, numbered in the caption's text.
QWENIMAGE_EDIT_PLUS = replace(
    QWENIMAGE_EDIT,
    name=PLUS_EDIT.entry,
    label=PLUS_EDIT.label,
    models=PLUS_LINE,
    lines=(PLUS_LINE,),
    edit=PLUS_EDIT,
    claims=Deferred(f"{_PACKAGE}.load:claims_qwenimage_edit_plus"),
    file_setting='model_version = "edit-2509" or "edit-2511"',
    load=Deferred(f"{_PACKAGE}.load:load_qwenimage_edit_plus"),
    # the older key names are the first edit model's trainer's
    kohya=KohyaVocabulary(),
    tool=replace(QWENIMAGE_EDIT.tool, variant_labels={"qwenimage-edit-plus": PLUS_LINE}),
)
