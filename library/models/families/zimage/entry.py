"""Z-Image's entry in the family registry: what shared code asks of it before loading it.

Readable without torch or diffusers: the loader, the family class and the objective are named
and imported on first use."""

from __future__ import annotations

from library.models.families.family_entry import (
    Deferred,
    FamilyEntry,
    KohyaVocabulary,
    LoraFiles,
    ToolFacts,
)
from library.models.families.text_encoder_keys import TextEncoderFileKeys
from library.models.families.zimage.musubi_options import OPTIONS as MUSUBI_OPTIONS
from library.training.flow_keys import SIGMA_KEYS

_LINE = "Z-Image"
_PACKAGE = "library.models.families.zimage"
# The [flow] keys of the flow-matching draw of Z-Image's objective (objective.py) and its
# text-encoder file beside a single transformer file (files.py; the AE file is
# [model] vae, which the loader reads itself: reads_vae).
FLOW_KEYS = frozenset(SIGMA_KEYS) | {"text_encoder"}
# Module names only Z-Image LoRA files hold (lora_keys.py): ours and ai-toolkit's, diffusers'
# peft names, musubi-tuner's kohya names; joint and refiner blocks.
_DENOISER_MARKS = tuple(
    (head + block, _LINE)
    for head, blocks in (
        ("diffusion_model.", ("layers.", "noise_refiner.", "context_refiner.")),
        ("transformer.", ("noise_refiner.", "context_refiner.")),
        ("lora_unet_", ("layers_", "noise_refiner_", "context_refiner_")),
    )
    for block in blocks
)

ZIMAGE = FamilyEntry(
    name="zimage",
    label="Z-Image",
    models=_LINE,
    lines=(_LINE,),
    family=Deferred(f"{_PACKAGE}.family:ZImageFamily").get,
    claims=Deferred(f"{_PACKAGE}.spec:claims_zimage"),
    load=Deferred(f"{_PACKAGE}.load:load_zimage"),
    reads_vae=True,
    # musubi-tuner's LoRA module for Z-Image (its files say ss_network_module so)
    network_module="networks.lora_zimage",
    flow_matching=True,
    config_keys=(TextEncoderFileKeys,),
    flow_keys=FLOW_KEYS,
    # musubi-tuner's Z-Image options difftune does not implement
    kohya=KohyaVocabulary(options=MUSUBI_OPTIONS),
    lora_files=LoraFiles(
        denoiser_marks=_DENOISER_MARKS,
        architectures=(("Z-Image", _LINE),),
    ),
    tool=ToolFacts(
        component_options={"text_encoder": "the text encoder file beside a transformer file"},
        variant_labels={
            "zimage-turbo": "Z-Image Turbo",
            "zimage-base": "Z-Image Base",
            "zimage-custom": "Z-Image",
        },
        version_marks=(("z_image", _LINE),),
        # the toolbox's "comfyui" layout of Z-Image is diffusion_model.<diffusers path>, what
        # key_map.py writes (and ComfyUI, ai-toolkit and diffusers read); its "kohya" layout is
        # musubi-tuner's (lora_keys.py)
        own_layout="comfyui",
        comfy_model_name=Deferred(f"{_PACKAGE}.lora_keys:comfy_model_name"),
        comfy_keys=Deferred(f"{_PACKAGE}.lora_keys:comfy_keys"),
        layout_names={
            "comfyui": "diffusion_model.<diffusers path>, also ai-toolkit's",
            "kohya": "musubi-tuner's lora_unet_<diffusers path>",
            "diffusers": "diffusers' transformer.<diffusers path>",
        },
    ),
)
