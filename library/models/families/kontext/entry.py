"""FLUX.1 Kontext [dev]'s entry in the family registry: what shared code asks of it before
loading it. Its files, keys and LoRA layout are FLUX.1's (flux/entry.py); what differs is how
a model is recognised (a FluxKontextPipeline folder, or model_type = "flux_kontext") and that
each training image comes with its reference image: an edit variant of FLUX.1's family
(library.models.families.edit_variant), not a family class of its own.

Readable without torch or diffusers: the loader and the hooks are named and imported on first
use."""

from __future__ import annotations

from library.models.families.family_entry import Deferred, FamilyEntry, KohyaVocabulary, ToolFacts
from library.models.families.flux.entry import FLUX
from library.models.families.kontext.variant import EDIT, LINE

_PACKAGE = "library.models.families.kontext"

KONTEXT = FamilyEntry(
    name=EDIT.entry,
    label=EDIT.label,
    models=LINE,
    lines=(LINE,),
    family=FLUX.family,
    edit=EDIT,
    claims=Deferred(f"{_PACKAGE}.load:claims_kontext"),
    load=Deferred(f"{_PACKAGE}.load:load_kontext"),
    # a FluxKontextPipeline folder's transformer is FLUX.1's, which FLUX.1's claim takes
    claims_within=FLUX.name,
    file_setting='model_type = "flux_kontext"',
    # musubi-tuner trains Kontext with kohya's FLUX.1 network module
    network_module=FLUX.network_module,
    flow_matching=True,
    # FLUX.1's keys (the classes are FLUX.1's, named by both entries)
    config_keys=FLUX.config_keys,
    flow_keys=FLUX.flow_keys,
    kohya=KohyaVocabulary(
        options=FLUX.kohya.options,
        network_args=FLUX.kohya.network_args,
        off_network_args=FLUX.kohya.off_network_args,
        refused_network_args=FLUX.kohya.refused_network_args,
        # musubi-tuner's older name of its dataset key no_resize_control, and its Kontext
        # trainer's names of the text encoder files (flux_kontext_train_network.py)
        aliases={
            "flux_kontext_no_resize_control": "no_resize_control",
            "text_encoder1": "t5xxl",
            "text_encoder2": "clip_l",
        },
    ),
    # its LoRA files are FLUX.1's (kohya's names of the same transformer): nothing tells the
    # files of the two apart, so they are one line to the file checks (a FLUX.1 LoRA continues
    # training on Kontext, and a Kontext LoRA loads on FLUX.1, as in ComfyUI), whose marks
    # FLUX.1's entry names
    tool=ToolFacts(
        component_options=FLUX.tool.component_options,
        variant_labels={"flux-kontext-dev": "FLUX.1 Kontext [dev]"},
        line_of=lambda family: FLUX.lines[0],
        to_original=FLUX.tool.to_original,
        comfy_keys=FLUX.tool.comfy_keys,
    ),
)
