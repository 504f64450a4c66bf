"""kohya's LoRA module names for diffusers' ChromaTransformer2DModel.

Chroma's original model (lodestones' flow repository, ComfyUI's comfy/ldm/chroma) keeps FLUX.1's
module tree for its blocks: ``double_blocks.<i>`` with ``img_attn.qkv``, ``img_attn.proj``,
``img_mlp.0``, ``img_mlp.2`` and the same for ``txt_``, and ``single_blocks.<i>`` with
``linear1`` (q, k, v and the MLP input in one Linear) and ``linear2``. It drops every block's
modulation Linear (``img_mod.lin``, ``txt_mod.lin``, ``modulation.lin``): the modulation comes
from the ``distilled_guidance_layer`` instead. kohya's networks.lora_flux (which trains Chroma
too) names a module ``lora_unet_`` + that path with underscores; ComfyUI maps that name onto
``diffusion_model.<path>.weight`` of every model, and diffusers' FluxLoraLoaderMixin (which
ChromaPipeline uses) converts it into its split Linears. A fused layer's separate adapters are
written as one module (stacked down weights, block-diagonal up: library/networks/fused_keys.py);
the modules come from the name table (original_keys.py, library/networks/table_modules.py).
"""

from __future__ import annotations

from torch import nn

from library.models.families.chroma.original_keys import TABLE
from library.networks.fused_keys import KohyaModule
from library.networks.table_modules import table_modules

TRANSFORMER = "lora_unet"
_LISTS = {
    "double": ("double_blocks", "transformer_blocks"),
    "single": ("single_blocks", "single_transformer_blocks"),
}


def transformer_modules(transformer: nn.Module, train_blocks: str = "all") -> list[KohyaModule]:
    """kohya's modules of the double and single blocks (``train_blocks``: "all", "double" or
    "single"), in kohya's order: every Linear of every block (8 per double block, 2 per single
    block). Works on a model on the meta device and on one already given adapters."""
    lists = [lists for kind, lists in _LISTS.items() if train_blocks in ("all", kind)]
    return table_modules(transformer, TRANSFORMER, TABLE, lists)
