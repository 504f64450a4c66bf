"""Qwen-Image's entry in the family registry: what shared code asks of it before loading it.

Readable without torch or diffusers: the loader, the family class and the kit are named and
imported on first use."""

from __future__ import annotations

from library.models.families.family_entry import (
    Deferred,
    FamilyEntry,
    KohyaVocabulary,
    LoraFiles,
    ToolFacts,
)
from library.models.families.qwenimage.config_keys import VERSIONS, QwenImageFlowKeys
from library.models.families.qwenimage.musubi_options import OPTIONS as MUSUBI_OPTIONS
from library.models.families.text_encoder_keys import TextEncoderFileKeys
from library.training.flow_keys import SIGMA_KEYS

_LINE = "Qwen-Image"
_PACKAGE = "library.models.families.qwenimage"
# The [flow] keys of the flow-matching draw (objective.py), and beside a single transformer
# file its Qwen2.5-VL file and which release it is (spec.py; the VAE file is [model] vae, which
# the loader reads itself: reads_vae), and whether a LoRA adapts the blocks' modulation
# (targets.py)
FLOW_KEYS = frozenset(SIGMA_KEYS) | {"text_encoder", "model_version", "exclude_mod"}
# Module names only Qwen-Image LoRA files hold: its blocks' per-stream feed-forwards (img_mlp,
# txt_mlp; SD3's and FLUX.1's blocks name theirs ff / ff_context), which every default LoRA
# adapts, in ours (diffusion_model.), diffusers' peft (transformer.) and kohya's names, for each
# of the released model's 60 blocks (the marks are name starts).
_BLOCKS = 60
_DENOISER_MARKS = tuple(
    (f"{head}{i}{dot}{stream}", _LINE)
    for head, dot in (
        ("diffusion_model.transformer_blocks.", "."),
        ("transformer.transformer_blocks.", "."),
        ("lora_unet_transformer_blocks_", "_"),
    )
    for i in range(_BLOCKS)
    for stream in ("img_mlp", "txt_mlp")
)

_TEXT_ENCODER_OPTION = "the text encoder file beside a transformer file"

QWENIMAGE = FamilyEntry(
    name="qwenimage",
    label="Qwen-Image",
    models=_LINE,
    lines=(_LINE,),
    family=Deferred(f"{_PACKAGE}.family:QwenImageFamily").get,
    claims=Deferred(f"{_PACKAGE}.spec:claims_qwenimage"),
    load=Deferred(f"{_PACKAGE}.load:load_qwenimage"),
    reads_vae=True,
    # musubi-tuner's LoRA module for Qwen-Image (its files say ss_network_module so)
    network_module="networks.lora_qwen_image",
    flow_matching=True,
    config_keys=(TextEncoderFileKeys, QwenImageFlowKeys),
    flow_keys=FLOW_KEYS,
    model_versions=VERSIONS,
    # musubi-tuner's Qwen-Image options difftune does not implement, and networks.lora_qwen_image's
    # argument, read into [flow] exclude_mod
    kohya=KohyaVocabulary(options=MUSUBI_OPTIONS, network_args=("exclude_mod",)),
    lora_files=LoraFiles(
        denoiser_marks=_DENOISER_MARKS,
        architectures=(("Qwen-Image", _LINE),),
    ),
    tool=ToolFacts(
        component_options={"text_encoder": _TEXT_ENCODER_OPTION},
        variant_labels={"qwenimage": "Qwen-Image"},
        version_marks=(("qwen_image", _LINE),),
        # the toolbox's "comfyui" layout of Qwen-Image is diffusion_model.<diffusers path>, what
        # key_map.py writes (and ComfyUI and diffusers read)
        own_layout="comfyui",
        comfy_model_name=Deferred(f"{_PACKAGE}.key_map:comfy_model_name"),
        comfy_keys=Deferred(f"{_PACKAGE}.key_map:comfy_keys"),
        layout_names={
            "comfyui": "diffusion_model.<diffusers path>",
            "kohya": "musubi-tuner's lora_unet_<diffusers path>",
            "diffusers": "diffusers' transformer.<diffusers path>",
        },
    ),
)
