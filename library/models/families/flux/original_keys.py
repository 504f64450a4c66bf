"""FLUX.1 state dicts: the original Black Forest Labs names <-> diffusers names, both directions.

- Transformer: ``transformer_to_original`` / ``transformer_from_original``. The original layout is
  that of flux1-dev.safetensors and flux1-schnell.safetensors (``double_blocks.N.img_attn.qkv``,
  ``single_blocks.N.linear1``, ``img_in``, ...); ComfyUI-style full checkpoints put it under
  ``model.diffusion_model.``, which ``transformer_from_original`` strips. Fused projections are
  split (original -> diffusers) or concatenated (diffusers -> original): q|k|v in the double
  blocks, q|k|v|mlp-in in a single block's ``linear1``. The final layer's modulation holds
  (shift, scale) in the original and (scale, shift) in diffusers, so its halves are swapped.
  Both come from one name table (``TABLE``: the shared dual/single-stream block stems,
  library/models/families/name_table.py, with FLUX.1's modulation Linears and embedders).
- AE: ``ae_to_original`` / ``ae_from_original``. ae.safetensors uses SD's LDM VAE names without
  the ``first_stage_model.`` prefix and without quant convs, so library/models/original_names.py
  does the renaming.
- ``detect_flux``: which layout and variant a transformer file holds, from its key names.

All functions take a mapping of tensors and only cut, join and rename them, so they work on
meta tensors and on any dtype (fp8 included). ``convert_shapes`` runs them on key -> shape.
Split pieces are views of the fused tensor: clone them before saving them with safetensors.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

from library.models.families.name_table import (
    CHECKPOINT_PREFIX,
    DUAL_STREAM_BLOCK,
    SINGLE_STREAM_BLOCK,
    NameTable,
    Stem,
    count_numbered,
)
from library.models.families.name_table import join_parts as join_parts  # SD3's converters
from library.models.families.name_table import swap_halves as swap_halves
from library.models.families.shape_origins import convert_shapes as convert_shapes
from library.models.original_names import ldm_vae_from_original, ldm_vae_to_original

ORIGINAL_PREFIX = CHECKPOINT_PREFIX

# The shared dual- and single-stream block stems with FLUX.1's per-block modulation Linears, and
# its embedders; the final layer's adaLN is (shift, scale) in the original, (scale, shift) here.
# In kohya's order of the Linears (lora_keys.py): each stream's modulation before its attention,
# the input embedders in_dims adapts before the final layer.
_FINAL_ADALN = "final_layer.adaLN_modulation.1"


def _stream(name: str, modulation: str) -> dict[str, Stem]:
    """One stream's stems of a double block, its modulation Linear first."""
    stems = {k: v for k, v in DUAL_STREAM_BLOCK.items() if k.startswith(name)}
    return {f"{name}_mod.lin": modulation, **stems}


TABLE = NameTable(
    top={
        "img_in": "x_embedder",
        "time_in.in_layer": "time_text_embed.timestep_embedder.linear_1",
        "time_in.out_layer": "time_text_embed.timestep_embedder.linear_2",
        "vector_in.in_layer": "time_text_embed.text_embedder.linear_1",
        "vector_in.out_layer": "time_text_embed.text_embedder.linear_2",
        "guidance_in.in_layer": "time_text_embed.guidance_embedder.linear_1",
        "guidance_in.out_layer": "time_text_embed.guidance_embedder.linear_2",
        "txt_in": "context_embedder",
        "final_layer.linear": "proj_out",
        _FINAL_ADALN: "norm_out.linear",
    },
    lists=(
        (
            "double_blocks",
            "transformer_blocks",
            _stream("img", "norm1.linear") | _stream("txt", "norm1_context.linear"),
        ),
        (
            "single_blocks",
            "single_transformer_blocks",
            SINGLE_STREAM_BLOCK | {"modulation.lin": "norm.linear"},
        ),
    ),
    model="FluxTransformer2DModel",
    swapped=(f"{_FINAL_ADALN}.weight", f"{_FINAL_ADALN}.bias"),
)
# The input embedders (kohya's in_dims), the top-level Linears before the final layer.
EMBEDDERS = tuple(stem for stem in TABLE.top if not stem.startswith("final_layer."))


transformer_to_original = TABLE.to_original  # raises ValueError for a key it does not know
transformer_from_original = TABLE.from_original  # ``model.diffusion_model.`` prefixes stripped


# --- AE ---------------------------------------------------------------------------------------

# ae.safetensors: SD's LDM VAE names without a prefix or quant convs (attention as 1x1 convs).
ae_to_original = ldm_vae_to_original
ae_from_original = ldm_vae_from_original


# --- shapes and detection ---------------------------------------------------------------------


@dataclass(frozen=True)
class FluxKeys:
    """What the key names of a FLUX.1 transformer file say."""

    layout: Literal["original", "diffusers"]
    variant: Literal["dev", "schnell"]  # dev has the guidance embedding, schnell does not
    prefix: str  # before every transformer key: "" or "model.diffusion_model."
    double_blocks: int
    single_blocks: int


# Keys only a FLUX.1 transformer has together. vector_in / text_embedder (CLIP's pooled input)
# exclude FLUX.2 and Chroma, the single blocks exclude SD3, and every SD / SDXL file.
ORIGINAL_MARKS = (
    "img_in.weight",
    "vector_in.in_layer.weight",
    "double_blocks.0.img_attn.qkv.weight",
    "single_blocks.0.linear1.weight",
)
DIFFUSERS_MARKS = (
    "x_embedder.weight",
    "time_text_embed.text_embedder.linear_1.weight",
    "transformer_blocks.0.attn.add_q_proj.weight",
    "single_transformer_blocks.0.proj_mlp.weight",
)


def detect_flux(keys: Iterable[str]) -> FluxKeys | None:
    """The layout and variant of a FLUX.1 transformer state dict, or None for anything else.

    By key names only, so FLUX.1 Fill / Depth (more input channels) read as dev.
    """
    keys = set(keys)
    for prefix in ("", ORIGINAL_PREFIX):
        if all(prefix + k in keys for k in ORIGINAL_MARKS):
            dev = prefix + "guidance_in.in_layer.weight" in keys
            double = count_numbered(keys, prefix + "double_blocks")
            single = count_numbered(keys, prefix + "single_blocks")
            return FluxKeys("original", "dev" if dev else "schnell", prefix, double, single)
    if all(k in keys for k in DIFFUSERS_MARKS):
        dev = "time_text_embed.guidance_embedder.linear_1.weight" in keys
        double = count_numbered(keys, "transformer_blocks")
        single = count_numbered(keys, "single_transformer_blocks")
        return FluxKeys("diffusers", "dev" if dev else "schnell", "", double, single)
    return None
