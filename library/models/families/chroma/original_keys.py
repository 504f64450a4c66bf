"""Chroma's transformer: its original names (lodestones' Chroma1-HD.safetensors, ComfyUI's Chroma
model; full checkpoints under ``model.diffusion_model.``) <-> diffusers names, as one table.

The shared dual- and single-stream block tables (library/models/families/name_table.py) without
any modulation Linear or time/vector/guidance embedder, plus the ``distilled_guidance_layer``
(``in_proj``, ``layers.<i>.in_layer`` / ``out_layer``, ``norms.<i>.scale``, ``out_proj``), which
gives every block and the final layer their shift and scale (so nothing is swapped). Checked
against diffusers' ``convert_chroma_transformer_checkpoint_to_diffusers`` (tests/conformance).
"""

from __future__ import annotations

from library.models.families.name_table import DUAL_STREAM_BLOCK, SINGLE_STREAM_BLOCK, NameTable

GUIDANCE = "distilled_guidance_layer"
TABLE = NameTable(
    top={
        "img_in": "x_embedder",
        "txt_in": "context_embedder",
        "final_layer.linear": "proj_out",
        f"{GUIDANCE}.in_proj": f"{GUIDANCE}.in_proj",
        f"{GUIDANCE}.out_proj": f"{GUIDANCE}.out_proj",
    },
    lists=(
        ("double_blocks", "transformer_blocks", DUAL_STREAM_BLOCK),
        ("single_blocks", "single_transformer_blocks", SINGLE_STREAM_BLOCK),
        (
            f"{GUIDANCE}.layers",
            f"{GUIDANCE}.layers",
            {"in_layer": "linear_1", "out_layer": "linear_2"},
        ),
        (f"{GUIDANCE}.norms", f"{GUIDANCE}.norms", {"scale": "weight"}),
    ),
    model="ChromaTransformer2DModel",
)
transformer_to_original = TABLE.to_original
transformer_from_original = TABLE.from_original
