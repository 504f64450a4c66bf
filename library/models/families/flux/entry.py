"""Flux.1's entry in the family registry: what shared code asks of it before loading it."""

from __future__ import annotations

from library.config.unsupported import Unsupported
from library.models.families.family_entry import (
    Deferred,
    FamilyEntry,
    KohyaVocabulary,
    LoraFiles,
    ToolFacts,
)
from library.models.families.flux.config_keys import FluxFlowKeys
from library.models.families.transformer_entry import (
    COMPONENT_OPTIONS,
    DIT_OPTIONS,
    FLOW_MATCHING_KEYS,
    NETWORK_ARGS,
    comfy_part_keys,
    refused_network_args,
)
from library.models.families.transformer_keys import TransformerFlowKeys

_LINE = "FLUX.1"
# kohya's names of the double- and single-stream blocks (the original model's)
_KOHYA_BLOCKS = ("lora_unet_double_blocks_", "lora_unet_single_blocks_")
_PART_KEYS = comfy_part_keys(("transformer.", "lycoris_", "lora_transformer_", ""))
_PLANNED_INDICES = "choosing FLUX.1 blocks by index is planned"
_PLANNED_GGPO = "kohya's GGPO perturbation of FLUX.1 LoRA weights is planned"


def _comfy_keys(layer, original: str) -> dict[str, tuple[int, ...] | None]:
    """The per-part names, and ComfyUI's name of a single block's fused q|k|v|mlp projection
    (linear1) for its q, k and v parts."""
    names = _PART_KEYS(layer, original)
    if original.endswith(".linear1"):
        names[f"diffusion_model.{original}_qkv"] = (0, 1, 2)
    return names


FLUX = FamilyEntry(
    name="flux",
    label="Flux.1",
    models=_LINE,
    lines=(_LINE,),
    family=Deferred("library.models.families.flux.family:FluxFamily").get,
    claims=Deferred("library.models.families.flux.spec:claims_flux"),
    load=Deferred("library.models.families.flux.load:load_flux"),
    network_module="networks.lora_flux",
    flow_matching=True,
    config_keys=(TransformerFlowKeys, FluxFlowKeys),
    flow_keys=FLOW_MATCHING_KEYS
    | {
        "ae",
        "train_blocks",
        "model_type",
        "guidance_scale",
        "timestep_sampling",
        "sigmoid_scale",
        "discrete_flow_shift",
        "model_prediction_type",
    },
    kohya=KohyaVocabulary(
        options={
            "split_mode": Unsupported(
                "deprecated in sd-scripts (use blocks_to_swap there)", (False,), planned=False
            ),
            **DIT_OPTIONS,
        },
        network_args=(*NETWORK_ARGS, "train_blocks"),
        # "all" (the kohya_ss GUI's default, written into every FLUX.1 export) is every block,
        # as without them; GGPO (gradient-guided perturbation) is on only when both are set.
        off_network_args={
            "train_double_block_indices": ((None, "all"), _PLANNED_INDICES),
            "train_single_block_indices": ((None, "all"), _PLANNED_INDICES),
            "ggpo_beta": ((None,), _PLANNED_GGPO),
            "ggpo_sigma": ((None,), _PLANNED_GGPO),
        },
        refused_network_args=refused_network_args(
            "networks.lora_flux",
            "img_attn_dim txt_attn_dim img_mlp_dim txt_mlp_dim img_mod_dim txt_mod_dim "
            "single_dim single_mod_dim in_dims",
        ),
    ),
    lora_files=LoraFiles(
        # diffusers' single-stream blocks: the layout of files other trainers write
        denoiser_marks=tuple(
            (start, _LINE) for start in (*_KOHYA_BLOCKS, "transformer.single_transformer_blocks.")
        ),
        text_prefixes={("lora_te1", "lora_te3"): _LINE},
        architectures=(("flux-1", _LINE),),
    ),
    tool=ToolFacts(
        component_options={
            **COMPONENT_OPTIONS,
            "ae": "the autoencoder file of a transformer file (ae.safetensors)",
        },
        variant_labels={"flux-dev": "FLUX.1 dev", "flux-schnell": "FLUX.1 schnell"},
        lora_marks=tuple((start, _LINE) for start in _KOHYA_BLOCKS),
        version_marks=(("flux", _LINE),),
        to_original=Deferred("library.models.families.flux.original_keys:transformer_to_original"),
        comfy_keys=_comfy_keys,
    ),
)
