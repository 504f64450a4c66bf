"""Krea 2's adapter files: written as ``diffusion_model.<original path>`` with peft's LoRA
tensors, alpha / r folded into the up factor (the layout diffusers' Krea2LoraLoaderMixin and ComfyUI
both apply completely: diffusers refuses any other key, an ``.alpha`` or kohya's ``lora_unet_``
names included); read under every name other tools write:

=======================================  =====================================================
``diffusion_model.<original path>``       difftune, ai-toolkit, Krea's trainer, ComfyUI
``base_model.model.<original path>``      ai-toolkit's peft files
``transformer.<diffusers path>``          diffusers' ``save_lora_weights``
``lora_unet_<original path, _ for .>``    musubi-tuner (``networks.lora_krea2``)
=======================================  =====================================================
"""

from __future__ import annotations

from torch import nn

from library.models.families.krea2.spec import linear_original
from library.networks.fused_keys import linears_inside
from library.networks.key_maps import PeftFoldedNames
from library.networks.kohya_names import unwrap
from library.networks.linear_files import LinearNames

PREFIX = "diffusion_model."
HEADS = (PREFIX, "base_model.model.")
PEFT_PREFIX = "transformer."
KOHYA_PREFIX = "lora_unet_"


def file_modules(transformer: nn.Module) -> dict[str, tuple[str, ...]]:
    """Every module name a Krea 2 adapter file may use -> the one diffusers Linear it names."""
    table: dict[str, tuple[str, ...]] = {}
    for path in linears_inside(unwrap(transformer)):
        original = linear_original(path)
        names = (*(head + original for head in HEADS), PEFT_PREFIX + path,
                 KOHYA_PREFIX + original.replace(".", "_"))  # fmt: skip
        for name in names:
            if table.setdefault(name, (path,)) != (path,):
                raise ValueError(f"{name} names both {table[name]} and {path}")
    return table


NAMES = LinearNames(
    family="Krea 2",
    table=file_modules,
    written=lambda path: PREFIX + linear_original(path),
    peft_prefix=PEFT_PREFIX,
    examples=f"{PREFIX}blocks.0.attn.wq or {PEFT_PREFIX}transformer_blocks.0.attn.to_q",
)


def krea2_names() -> PeftFoldedNames:
    """Krea 2's key map."""
    return PeftFoldedNames(prefix=PREFIX, names=NAMES)
