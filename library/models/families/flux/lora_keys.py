"""kohya's Flux.1 LoRA names for diffusers' FluxTransformer2DModel, CLIP-L and T5-XXL.

kohya's ``networks.lora_flux`` (and ComfyUI, which reads its files) names a LoRA module
``lora_unet_`` + the module's path in the original Black Forest Labs model with dots as
underscores, e.g. ``lora_unet_double_blocks_0_img_attn_qkv``. The original model computes q, k
and v of an attention with one fused Linear (``img_attn.qkv``, ``txt_attn.qkv``) and a single
block's q, k, v and MLP input with one (``linear1``); diffusers splits them into separate
Linears (``attn.to_q``, ... , ``proj_mlp``). A :class:`KohyaModule` records which diffusers
Linears one kohya name stands for, in the order of the fused layer's output rows. This file
holds FLUX.1's tables; the model-independent machinery (fusing on export, splitting on import,
the adapters' weights) is library/networks/fused_keys.py, re-exported here.

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

from library.networks.fused_keys import (
    KohyaModule,
    LoraWeights,
    adapter_weights,
    export_lora,
    import_lora,
    kohya_module,
    load_adapter_weights,
    target_paths,
    text_encoder_modules,
)
from library.networks.kohya_names import unwrap

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

# Original path inside double_blocks.{i} -> diffusers paths inside transformer_blocks.{i}, in the
# order nn.Module.named_modules visits DoubleStreamBlock (the order kohya creates its modules).
# The fused parts are listed in the order of the fused weight's rows (q, k, v).
_DOUBLE_BLOCK = (
    ("img_mod.lin", ("norm1.linear",)),
    ("img_attn.qkv", ("attn.to_q", "attn.to_k", "attn.to_v")),
    ("img_attn.proj", ("attn.to_out.0",)),
    ("img_mlp.0", ("ff.net.0.proj",)),
    ("img_mlp.2", ("ff.net.2",)),
    ("txt_mod.lin", ("norm1_context.linear",)),
    ("txt_attn.qkv", ("attn.add_q_proj", "attn.add_k_proj", "attn.add_v_proj")),
    ("txt_attn.proj", ("attn.to_add_out",)),
    ("txt_mlp.0", ("ff_context.net.0.proj",)),
    ("txt_mlp.2", ("ff_context.net.2",)),
)
# single_blocks.{i} -> single_transformer_blocks.{i}; linear1's rows are q, k, v, then the MLP.
_SINGLE_BLOCK = (
    ("linear1", ("attn.to_q", "attn.to_k", "attn.to_v", "proj_mlp")),
    ("linear2", ("proj_out",)),
    ("modulation.lin", ("norm.linear",)),
)
# The Modulation layers: their output chunks (shift, scale, gate, ...) come in the same order in
# both models, so they map one-to-one; kohya adapts them unless *_mod_dim=0.
_MODULATION = {"img_mod.lin", "txt_mod.lin", "modulation.lin"}
# Input embedders, adapted by kohya only with the in_dims option (img, time, vector, guidance,
# txt). guidance_in exists only in guidance-distilled models (dev, not schnell).
_EMBEDDERS = (
    ("img_in", "x_embedder"),
    ("time_in.in_layer", "time_text_embed.timestep_embedder.linear_1"),
    ("time_in.out_layer", "time_text_embed.timestep_embedder.linear_2"),
    ("vector_in.in_layer", "time_text_embed.text_embedder.linear_1"),
    ("vector_in.out_layer", "time_text_embed.text_embedder.linear_2"),
    ("guidance_in.in_layer", "time_text_embed.guidance_embedder.linear_1"),
    ("guidance_in.out_layer", "time_text_embed.guidance_embedder.linear_2"),
    ("txt_in", "context_embedder"),
)


def transformer_modules(
    transformer: nn.Module,
    *,
    train_blocks: TrainBlocks = "all",
    modulation: bool = True,
    embedders: bool = False,
    double_indices: Collection[int] | None = None,
    single_indices: Collection[int] | None = None,
) -> list[KohyaModule]:
    """The kohya modules of a FluxTransformer2DModel, in kohya's order.

    The defaults are kohya's: every Linear of every double and single block, modulation
    included (19 x 10 + 38 x 3 = 304 modules for Flux.1). ``train_blocks``, ``modulation=False``
    (kohya's img/txt/single_mod_dim=0), ``embedders=True`` (in_dims for all five input
    embedders) and the block indices (train_double/single_block_indices) select as kohya does.
    Works on a model on the meta device.
    """
    if train_blocks not in ("all", "double", "single"):
        raise ValueError(f"train_blocks must be 'all', 'double' or 'single', not {train_blocks!r}")
    transformer = unwrap(transformer)
    modules: list[KohyaModule] = []
    # kohya creates the double-block modules first, then the single ones, then the embedders.
    sections = []
    if train_blocks in ("all", "double"):
        sections.append(("double_blocks", "transformer_blocks", _DOUBLE_BLOCK, double_indices))
    if train_blocks in ("all", "single"):
        sections.append(
            ("single_blocks", "single_transformer_blocks", _SINGLE_BLOCK, single_indices)
        )
    for original_list, diffusers_list, layout, indices in sections:
        blocks = transformer.get_submodule(diffusers_list)
        for index in range(len(blocks)):
            if indices is not None and index not in indices:
                continue
            for original, parts in layout:
                if not modulation and original in _MODULATION:
                    continue
                modules.append(
                    kohya_module(
                        transformer,
                        TRANSFORMER,
                        f"{original_list}.{index}.{original}",
                        (f"{diffusers_list}.{index}.{part}" for part in parts),
                    )
                )
    if embedders:
        for original, path in _EMBEDDERS:
            try:
                transformer.get_submodule(path)
            except AttributeError:
                continue  # no guidance embedder in schnell
            modules.append(kohya_module(transformer, TRANSFORMER, original, (path,)))
    return modules
