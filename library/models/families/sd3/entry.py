"""SD3/SD3.5's entry in the family registry: what shared code asks of it before loading it."""

from __future__ import annotations

from library.config.unsupported import Unsupported
from library.config.unsupported import group as _group
from library.models.families.family_entry import (
    Deferred,
    FamilyEntry,
    KohyaVocabulary,
    LoraFiles,
    ToolFacts,
)
from library.models.families.sd3.config_keys import SD3FlowKeys
from library.models.families.transformer_entry import (
    COMPONENT_OPTIONS,
    DIT_OPTIONS,
    FLOW_MATCHING_KEYS,
    NETWORK_ARGS,
    comfy_part_keys,
    refused_network_args,
)
from library.models.families.transformer_keys import TransformerFlowKeys

_LINE = "SD3/SD3.5"
_KOHYA_BLOCKS = (("lora_unet_joint_blocks_", _LINE),)
_UNIMPLEMENTED = "sd-scripts does not implement it"

SD3 = FamilyEntry(
    name="sd3",
    label="SD3",
    models=_LINE,
    article="an",
    lines=(_LINE,),
    family=Deferred("library.models.families.sd3.family:SD3Family").get,
    claims=Deferred("library.models.families.sd3.spec:claims_sd3"),
    load=Deferred("library.models.families.sd3.family:load_sd3"),
    # SD3's single files may hold no VAE: the loader needs [model] vae to build one.
    reads_vae=True,
    network_module="networks.lora_sd3",
    flow_matching=True,
    config_keys=(TransformerFlowKeys, SD3FlowKeys),
    flow_keys=FLOW_MATCHING_KEYS
    | {
        "clip_g",
        "apply_lg_attn_mask",
        "clip_l_dropout_rate",
        "clip_g_dropout_rate",
        "t5_dropout_rate",
        "training_shift",
        "enable_scaled_pos_embed",
        "pos_emb_random_crop_rate",
    },
    kohya=KohyaVocabulary(
        # The options its own help marks "[DOES NOT WORK]"; the GUI writes them anyway
        # (t5xxl_dtype = "bf16" by default).
        options={
            **DIT_OPTIONS,
            **_group("save_clip save_t5xxl", _UNIMPLEMENTED, (False,), ignored=True),
            "t5xxl_device": Unsupported(_UNIMPLEMENTED, ("",), ignored=True),
            "t5xxl_dtype": Unsupported(_UNIMPLEMENTED, ("", "bf16"), ignored=True),
        },
        network_args=NETWORK_ARGS,
        refused_network_args=refused_network_args(
            "networks.lora_sd3",
            "context_attn_dim context_mlp_dim context_mod_dim x_attn_dim x_mlp_dim x_mod_dim "
            "emb_dims train_block_indices",
        ),
    ),
    lora_files=LoraFiles(
        denoiser_marks=_KOHYA_BLOCKS,
        text_prefixes={("lora_te1", "lora_te2", "lora_te3"): _LINE},
        architectures=(("stable-diffusion-3", _LINE),),
    ),
    tool=ToolFacts(
        component_options={
            **COMPONENT_OPTIONS,
            "clip_g": "the CLIP-G text encoder file (unset: from the model file)",
        },
        variant_labels={
            "sd3-medium": "SD3 Medium",
            "sd3.5-medium": "SD3.5 Medium",
            "sd3.5-large": "SD3.5 Large",
        },
        lora_marks=_KOHYA_BLOCKS,
        # kohya's SD3 versions are its model types: "medium", "5-medium", "5-large", ...
        version_marks=tuple((mark, _LINE) for mark in ("sd3", "medium", "large", "5-")),
        to_original=Deferred("library.models.families.sd3.original_keys:transformer_to_original"),
        comfy_keys=comfy_part_keys(
            ("transformer.", "base_model.model.", "lora_transformer_", "lycoris_")
        ),
    ),
)
