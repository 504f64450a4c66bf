"""kohya's Flux.1 LoRA names for diffusers' FluxTransformer2DModel, CLIP-L and T5-XXL.

kohya's ``networks.lora_flux`` (and ComfyUI, which reads its files) names a LoRA module
``lora_unet_`` + the module's path in the original Black Forest Labs model with dots as
underscores, e.g. ``lora_unet_double_blocks_0_img_attn_qkv``. The original model computes q, k
and v of an attention with one fused Linear (``img_attn.qkv``, ``txt_attn.qkv``) and a single
block's q, k, v and MLP input with one (``linear1``); diffusers splits them into separate
Linears (``attn.to_q``, ... , ``proj_mlp``). A :class:`KohyaModule` records which diffusers
Linears one kohya name stands for, in the order of the fused layer's output rows. The modules
come from FLUX.1's name table (original_keys.py, library/networks/table_modules.py); the
model-independent machinery (fusing on export, splitting on import, the adapters' weights) is
library/networks/fused_keys.py, re-exported here.

Separate adapters on the parts of a fused layer are written as ONE kohya module whose down
weights are stacked ([sum r, in]) and whose up weight is block-diagonal ([sum out, sum r]). Its
product is exactly the stacked per-part deltas, so every reader that merges ``alpha / rank * up @
down`` into the fused weight (kohya, ComfyUI) applies the same change, and diffusers recognises
the layout and splits it back. Readers take the rank from the file's down weight, so the file's
alpha is ``scale * sum r``: the parts must share one scale ``alpha / r``.

Text encoders are one-to-one: CLIP-L modules are ``lora_te1_`` + the transformers path (with
``text_model.`` as in transformers 4, like the SD text encoders), T5 modules ``lora_te3_`` + the
T5EncoderModel path (``lora_te3_encoder_block_0_layer_0_SelfAttention_q``).
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Literal

from torch import nn

from library.models.families.flux.original_keys import EMBEDDERS, TABLE
from library.networks.fused_keys import (
    KohyaModule,
    LoraWeights,
    adapter_weights,
    export_lora,
    import_lora,
    load_adapter_weights,
    target_paths,
    text_encoder_modules,
)
from library.networks.table_modules import table_modules, top_modules

__all__ = [
    "CLIP",
    "T5",
    "TRANSFORMER",
    "KohyaModule",
    "LoraWeights",
    "TrainBlocks",
    "adapter_weights",
    "export_lora",
    "import_lora",
    "load_adapter_weights",
    "target_paths",
    "text_encoder_modules",
    "transformer_modules",
]

TRANSFORMER = "lora_unet"
CLIP = "lora_te1"
T5 = "lora_te3"

TrainBlocks = Literal["all", "double", "single"]

# The Modulation layers: their output chunks (shift, scale, gate, ...) come in the same order in
# both models, so they map one-to-one; kohya adapts them unless *_mod_dim=0.
_MODULATION = ("img_mod.lin", "txt_mod.lin", "modulation.lin")
_LISTS = {
    "double": ("double_blocks", "transformer_blocks"),
    "single": ("single_blocks", "single_transformer_blocks"),
}


def transformer_modules(
    transformer: nn.Module,
    *,
    train_blocks: TrainBlocks = "all",
    modulation: bool = True,
    embedders: bool = False,
    double_indices: Collection[int] | None = None,
    single_indices: Collection[int] | None = None,
) -> list[KohyaModule]:
    """The kohya modules of a FluxTransformer2DModel, in kohya's order (the name table's,
    original_keys.py).

    The defaults are kohya's: every Linear of every double and single block, modulation
    included (19 x 10 + 38 x 3 = 304 modules for Flux.1). ``train_blocks``, ``modulation=False``
    (kohya's img/txt/single_mod_dim=0), ``embedders=True`` (in_dims for all five input
    embedders; guidance_in only where the model has it, dev) and the block indices
    (train_double/single_block_indices) select as kohya does. Works on a model on the meta
    device.
    """
    if train_blocks not in ("all", "double", "single"):
        raise ValueError(f"train_blocks must be 'all', 'double' or 'single', not {train_blocks!r}")
    indices = {"double_blocks": double_indices, "single_blocks": single_indices}

    def kept(module: KohyaModule) -> bool:
        block_list, index, stem = module.original.split(".", 2)
        chosen = indices[block_list]
        return (modulation or stem not in _MODULATION) and (chosen is None or int(index) in chosen)

    lists = [pair for kind, pair in _LISTS.items() if train_blocks in ("all", kind)]
    modules = [m for m in table_modules(transformer, TRANSFORMER, TABLE, lists) if kept(m)]
    if embedders:
        top = top_modules(transformer, TRANSFORMER, TABLE)
        modules += [m for m in top if m.original in EMBEDDERS]
    return modules
