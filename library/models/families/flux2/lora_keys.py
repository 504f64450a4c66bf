"""FLUX.2 LoRA files: kohya's names of the original model, which every reader applies whole.

A module is ``lora_unet_`` + its Black Forest Labs path with dots as underscores
(``lora_unet_double_blocks_0_img_attn_qkv``), as musubi-tuner writes FLUX.2 LoRAs; a fused qkv
holds the separate q, k and v adapters stacked (library/networks/fused_keys.py). The default
adapters (musubi-tuner's: every Linear of the double and single blocks) are exactly what
diffusers' Flux2LoraLoaderMixin converts from this layout (its kohya converter drops the shared
modulation Linears and the final adaLN, which no default adapter touches) and what ComfyUI
reads by the original names. Reading takes every Linear of the original model, modulation and
embedders included (the final adaLN's halves swapped back), as other tools' files may hold them.
"""

from __future__ import annotations

from library.models.families.flux2 import spec
from library.models.families.flux2.names import module_table
from library.networks.fused_keys import kohya_module
from library.networks.kohya_names import unwrap

UNET = "lora_unet"
# The Linears of the blocks (the norms are not Linears).
_BLOCK_LINEARS = ("qkv", "proj", "mlp.0", "mlp.2", "linear1", "linear2")


def file_modules(transformer, *, blocks_only: bool = False) -> list:
    """The kohya modules of the transformer's Linears (``blocks_only``: the double and single
    blocks', the default adapters), in the original model's order."""
    transformer = unwrap(transformer)
    modules = []
    for original, parts in module_table(
        k.replace(".base_layer", "") for k in transformer.state_dict()
    ).items():
        in_block = original.startswith(("double_blocks.", "single_blocks."))
        if in_block and not original.endswith(_BLOCK_LINEARS):
            continue
        if blocks_only and not in_block:
            continue
        modules.append(
            kohya_module(
                transformer, UNET, original, parts, swapped_halves=original in spec.SWAPPED
            )
        )
    return modules
