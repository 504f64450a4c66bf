"""The key map of Krea 2 adapter files: LoRAs written as ``diffusion_model.<original path>``
with peft's lora_A / lora_B and each adapter's alpha / r folded into lora_B; read under every
name other tools write.

Why this layout (diffusers 0.42.1's Krea2LoraLoaderMixin): diffusers reads ``transformer.``
peft names, or ``diffusion_model.`` / ``base_model.model.`` + the original module names with
lora_A / lora_B (its converter refuses any other key, an ``.alpha`` included); kohya's
``lora_unet_`` files load nothing. ComfyUI's Krea 2 model keeps the original names, whose
``diffusion_model.<name>`` its LoRA loader reads for every model; ai-toolkit and Krea's trainer
write the same. So that layout is the one both apply completely, and as it has no alpha, the
scale alpha / r is in lora_B (readers apply B A at scale 1). LyCORIS files keep their kind's
tensors under the same module names (ComfyUI reads them; diffusers reads no LyCORIS).

=====================================================  ==========================================
``diffusion_model.<original path>``                     difftune, ai-toolkit, Krea, ComfyUI
``base_model.model.<original path>``                    ai-toolkit's peft files
``transformer.<diffusers path>``                        diffusers' ``save_lora_weights`` (peft)
``lora_unet_<original path, _ for .>``                  musubi-tuner (``networks.lora_krea2``)
=====================================================  ==========================================
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
