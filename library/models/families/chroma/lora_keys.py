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
written as one module (stacked down weights, block-diagonal up: library/networks/fused_keys.py).
"""

from __future__ import annotations

from torch import nn

from library.networks.fused_keys import KohyaModule, kohya_module
from library.networks.kohya_names import unwrap

TRANSFORMER = "lora_unet"

# Original path inside double_blocks.{i} -> diffusers paths inside transformer_blocks.{i}; fused
# parts in the order of the fused weight's rows.
DOUBLE_BLOCK = (
    ("img_attn.qkv", ("attn.to_q", "attn.to_k", "attn.to_v")),
    ("img_attn.proj", ("attn.to_out.0",)),
    ("img_mlp.0", ("ff.net.0.proj",)),
    ("img_mlp.2", ("ff.net.2",)),
    ("txt_attn.qkv", ("attn.add_q_proj", "attn.add_k_proj", "attn.add_v_proj")),
    ("txt_attn.proj", ("attn.to_add_out",)),
    ("txt_mlp.0", ("ff_context.net.0.proj",)),
    ("txt_mlp.2", ("ff_context.net.2",)),
)
# single_blocks.{i} -> single_transformer_blocks.{i}; linear1's rows are q, k, v, then the MLP.
SINGLE_BLOCK = (
    ("linear1", ("attn.to_q", "attn.to_k", "attn.to_v", "proj_mlp")),
    ("linear2", ("proj_out",)),
)


def transformer_modules(transformer: nn.Module, train_blocks: str = "all") -> list[KohyaModule]:
    """kohya's modules of the double and single blocks (``train_blocks``: "all", "double" or
    "single"), in kohya's order: every Linear of every block (8 per double block, 2 per single
    block). Works on a model on the meta device and on one already given adapters."""
    transformer = unwrap(transformer)
    sections = []
    if train_blocks in ("all", "double"):
        sections.append(("double_blocks", "transformer_blocks", DOUBLE_BLOCK))
    if train_blocks in ("all", "single"):
        sections.append(("single_blocks", "single_transformer_blocks", SINGLE_BLOCK))
    modules = []
    for original_list, diffusers_list, layout in sections:
        for index in range(len(transformer.get_submodule(diffusers_list))):
            for original, parts in layout:
                modules.append(
                    kohya_module(
                        transformer,
                        TRANSFORMER,
                        f"{original_list}.{index}.{original}",
                        (f"{diffusers_list}.{index}.{part}" for part in parts),
                    )
                )
    return modules
