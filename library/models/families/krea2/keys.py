"""Krea 2's transformer in its original names (Krea's raw.safetensors / turbo.safetensors and
ComfyUI's, as diffusers' single-file and LoRA converters read them) as a name table
(families/name_table.py): each diffusers Linear is one original Linear, each main block's
modulation table [6, width] is stored flat. Adapter files (family.py, networks/path_names.py)
are written as ``diffusion_model.<original path>`` with peft's tensors, alpha / r folded into
the up factor: the layout diffusers' Krea2LoraLoaderMixin and ComfyUI both apply completely
(diffusers refuses any other key, an ``.alpha`` or kohya's ``lora_unet_`` names included)."""

from __future__ import annotations

from library.models.families.name_table import NameTable

# A main block's stems; the text fusion's blocks have the same without the modulation.
_BLOCK = {
    "attn.wq": "attn.to_q", "attn.wk": "attn.to_k", "attn.wv": "attn.to_v",
    "attn.wo": "attn.to_out.0", "attn.gate": "attn.to_gate",
    "attn.qknorm.qnorm.scale": "attn.norm_q.weight",
    "attn.qknorm.knorm.scale": "attn.norm_k.weight",
    "mlp.gate": "ff.gate", "mlp.up": "ff.up", "mlp.down": "ff.down",
    "prenorm.scale": "norm1.weight", "postnorm.scale": "norm2.weight",
}  # fmt: skip
TABLE = NameTable(
    top={
        "first": "img_in", "tmlp.0": "time_embed.linear_1", "tmlp.2": "time_embed.linear_2",
        "tproj.1": "time_mod_proj", "txtmlp.0.scale": "txt_in.norm.weight",
        "txtmlp.1": "txt_in.linear_1", "txtmlp.3": "txt_in.linear_2",
        "txtfusion.projector": "text_fusion.projector", "last.linear": "final_layer.linear",
        "last.norm.scale": "final_layer.norm.weight",
        "last.modulation.lin": "final_layer.scale_shift_table",
    },
    lists=(
        ("blocks", "transformer_blocks", {**_BLOCK, "mod.lin": "scale_shift_table"}),
        ("txtfusion.layerwise_blocks", "text_fusion.layerwise_blocks", _BLOCK),
        ("txtfusion.refiner_blocks", "text_fusion.refiner_blocks", _BLOCK),
    ),
    model="Krea2Transformer2DModel",
    width_key="first.weight",
    whole=("mod.lin", "last.modulation.lin"),
    rows={"mod.lin": 6},
)  # fmt: skip
state_to_original = TABLE.to_original  # the registry entry's ToolFacts.to_original
