"""The FLUX.2 transformer's original (Black Forest Labs) names <-> diffusers', as one table.

The shared dual- and single-stream block stems (library/models/families/name_table.py) with
FLUX.2's MLPs (``linear_in`` / ``linear_out``, no bias) and its single blocks' fused
q|k|v|mlp-in Linear, which diffusers keeps fused (``attn.to_qkv_mlp_proj``); q, k and v are one
fused ``qkv`` Linear in each double block's attention (rows q, k, v). At the top: the shared
modulation Linears (which tell FLUX.2 from FLUX.1) and the embedders; the final adaLN's rows are
(shift, scale) there and (scale, shift) in diffusers. Checked against diffusers'
``convert_flux2_transformer_checkpoint_to_diffusers`` (tests/conformance).

LoRA files (family.py's file_modules) take kohya's names of the original model:
``lora_unet_`` + the original path with dots as underscores
(``lora_unet_double_blocks_0_img_attn_qkv``), as musubi-tuner writes them, a fused qkv holding
the separate q, k and v adapters stacked (library/networks/fused_keys.py). The default adapters
(musubi-tuner's: every Linear of the double and single blocks) are exactly what diffusers'
Flux2LoraLoaderMixin converts from this layout (its kohya converter drops the shared
modulation Linears and the final adaLN, which no default adapter touches) and what ComfyUI
reads by the original names. Reading takes every Linear of the original model, modulation and
embedders included (the final adaLN's halves swapped back), as other tools' files may hold
them.
"""

from __future__ import annotations

from library.models.families.name_table import DUAL_STREAM_BLOCK, SINGLE_STREAM_BLOCK, NameTable

TRANSFORMER_CLASS = "Flux2Transformer2DModel"
_MLP = {"img_mlp.0": "ff.linear_in", "img_mlp.2": "ff.linear_out",
        "txt_mlp.0": "ff_context.linear_in", "txt_mlp.2": "ff_context.linear_out"}  # fmt: skip
TABLE = NameTable(
    top={
        "img_in": "x_embedder",
        "txt_in": "context_embedder",
        "time_in.in_layer": "time_guidance_embed.timestep_embedder.linear_1",
        "time_in.out_layer": "time_guidance_embed.timestep_embedder.linear_2",
        "guidance_in.in_layer": "time_guidance_embed.guidance_embedder.linear_1",
        "guidance_in.out_layer": "time_guidance_embed.guidance_embedder.linear_2",
        "double_stream_modulation_img.lin": "double_stream_modulation_img.linear",
        "double_stream_modulation_txt.lin": "double_stream_modulation_txt.linear",
        "single_stream_modulation.lin": "single_stream_modulation.linear",
        "final_layer.linear": "proj_out",
        "final_layer.adaLN_modulation.1": "norm_out.linear",  # rows' halves swapped
    },
    lists=(
        ("double_blocks", "transformer_blocks", {**DUAL_STREAM_BLOCK, **_MLP}),
        (
            "single_blocks",
            "single_transformer_blocks",
            {**SINGLE_STREAM_BLOCK, "linear1": "attn.to_qkv_mlp_proj", "linear2": "attn.to_out"},
        ),
    ),  # fmt: skip
    model=TRANSFORMER_CLASS,
    swapped=("final_layer.adaLN_modulation.1.weight", "final_layer.adaLN_modulation.1.bias"),
)
to_original = TABLE.to_original
