"""FLUX.2 LoRA files: kohya's names of the original model, which every reader applies whole.

A module is ``lora_unet_`` + its Black Forest Labs path with dots as underscores
(``lora_unet_double_blocks_0_img_attn_qkv``), as musubi-tuner writes FLUX.2 LoRAs; a fused qkv
holds the separate q, k and v adapters stacked (library/networks/fused_keys.py). The default
adapters (musubi-tuner's: every Linear of the double and single blocks) are exactly what
diffusers' Flux2LoraLoaderMixin converts from this layout (its kohya converter drops the shared
modulation Linears and the final adaLN, which no default adapter touches) and what ComfyUI
reads by the original names. Reading takes every Linear of the original model, modulation and
embedders included (the final adaLN's halves swapped back), as other tools' files may hold them.
All come from the name table (names.py).
"""

from __future__ import annotations

from library.models.families.flux2.names import TABLE
from library.networks.fused_keys import kohya_module
from library.networks.kohya_names import unwrap
from library.networks.table_modules import table_modules

UNET = "lora_unet"
_LISTS = (("double_blocks", "transformer_blocks"), ("single_blocks", "single_transformer_blocks"))


def file_modules(transformer, *, blocks_only: bool = False) -> list:
    """The kohya modules of the transformer's Linears (``blocks_only``: the double and single
    blocks', the default adapters), in the original model's order: top-level ones first."""
    blocks = table_modules(transformer, UNET, TABLE, _LISTS)
    if blocks_only:
        return blocks
    model = unwrap(transformer)
    present = {name for name, _ in model.named_modules()}
    top = [
        kohya_module(model, UNET, old, (new,), swapped_halves=f"{old}.weight" in TABLE.swapped)
        for old, new in TABLE.top.items()
        if new in present
    ]
    return top + blocks
