"""SD3 / SD3.5 state dicts: Stability AI's MMDiT names <-> diffusers names, both directions.

- Transformer: ``TABLE``, its name table (library/models/families/name_table.py), whose
  converters are ``transformer_to_original`` / ``transformer_from_original``. The original layout
  is that of sd3_medium.safetensors, sd3.5_medium.safetensors and sd3.5_large.safetensors
  (``joint_blocks.N.x_block.attn.qkv``, ``x_embedder.proj``, ``pos_embed``, ...), under
  ``model.diffusion_model.`` in those files, which ``transformer_from_original`` strips. Fused
  q|k|v projections are split (original -> diffusers) or concatenated (diffusers -> original).
  Two modulations hold (shift, scale) in the original and (scale, shift) in diffusers, so their
  halves are swapped: the final layer's, and the context modulation of the last block, whose
  context stream is "pre-only" (it feeds the last attention but has no output projection and
  no MLP).
- VAE: the files hold it under ``first_stage_model.`` in SD's LDM names without quant convs, as
  FLUX.1's ae.safetensors does: ``ae_to_original`` / ``ae_from_original`` rename it, without the
  prefix (library/models/original_names.py).
- ``detect_sd3``: which layout a file holds its MMDiT in, and under which prefix.
- ``transformer_config_from_shapes``: the SD3Transformer2DModel config a state dict's shapes show.

All converters take a mapping of tensors and only cut, join and rename them, so they work on meta
tensors and on any dtype (fp8 included). ``convert_shapes`` runs them on key -> shape. They take
whole blocks: a block's pre-only context stream is recognised by its missing context MLP. Split
pieces are views of the fused tensor: clone them before saving them with safetensors.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from typing import Literal

from library.models import shape_configs
from library.models.families.name_table import CHECKPOINT_PREFIX, NameTable, count_numbered
from library.models.families.sd3 import shapes as sd3_shapes
from library.models.families.sd3.shapes import Variant
from library.models.families.shape_origins import convert_shapes
from library.models.original_names import ldm_vae_from_original as ae_from_original
from library.models.original_names import ldm_vae_to_original as ae_to_original

__all__ = [
    "ORIGINAL_PREFIX",
    "VAE_PREFIX",
    "TEXT_ENCODER_PREFIXES",
    "TABLE",
    "ae_from_original",
    "ae_to_original",
    "convert_shapes",
    "detect_sd3",
    "transformer_config_from_shapes",
    "transformer_from_original",
    "transformer_to_original",
    "variant_for",
]

ORIGINAL_PREFIX = CHECKPOINT_PREFIX
Layout = Literal["original", "diffusers"]
VAE_PREFIX = "first_stage_model."
# Where a full checkpoint keeps each text encoder, in transformers' key names (ComfyUI's
# supported_models.SD3, sd-scripts' sd3_utils, diffusers' single_file_utils read the same).
TEXT_ENCODER_PREFIXES = {
    "clip_l": "text_encoders.clip_l.transformer.",
    "clip_g": "text_encoders.clip_g.transformer.",
    "t5xxl": "text_encoders.t5xxl.transformer.",
}

# Original parameter stem -> diffusers stem(s), in the order the original concatenates them.
# A stem stands for ``<stem>.weight`` and ``<stem>.bias``; ``pos_embed`` (the position table)
# and the ``.weight`` stems (the RMSNorm scales of the q/k norms, which have no bias) are whole keys.
_TOP = {
    "x_embedder.proj": "pos_embed.proj",
    "pos_embed": "pos_embed.pos_embed",
    "t_embedder.mlp.0": "time_text_embed.timestep_embedder.linear_1",
    "t_embedder.mlp.2": "time_text_embed.timestep_embedder.linear_2",
    "y_embedder.mlp.0": "time_text_embed.text_embedder.linear_1",
    "y_embedder.mlp.2": "time_text_embed.text_embedder.linear_2",
    "context_embedder": "context_embedder",
    "final_layer.linear": "proj_out",
    "final_layer.adaLN_modulation.1": "norm_out.linear",
}
_BLOCK = {
    "x_block.adaLN_modulation.1": "norm1.linear",
    "x_block.attn.qkv": ("attn.to_q", "attn.to_k", "attn.to_v"),
    "x_block.attn.ln_q.weight": "attn.norm_q.weight",
    "x_block.attn.ln_k.weight": "attn.norm_k.weight",
    "x_block.attn.proj": "attn.to_out.0",
    "x_block.attn2.qkv": ("attn2.to_q", "attn2.to_k", "attn2.to_v"),
    "x_block.attn2.ln_q.weight": "attn2.norm_q.weight",
    "x_block.attn2.ln_k.weight": "attn2.norm_k.weight",
    "x_block.attn2.proj": "attn2.to_out.0",
    "x_block.mlp.fc1": "ff.net.0.proj",
    "x_block.mlp.fc2": "ff.net.2",
    "context_block.adaLN_modulation.1": "norm1_context.linear",
    "context_block.attn.qkv": ("attn.add_q_proj", "attn.add_k_proj", "attn.add_v_proj"),
    "context_block.attn.ln_q.weight": "attn.norm_added_q.weight",
    "context_block.attn.ln_k.weight": "attn.norm_added_k.weight",
    "context_block.attn.proj": "attn.to_add_out",
    "context_block.mlp.fc1": "ff_context.net.0.proj",
    "context_block.mlp.fc2": "ff_context.net.2",
}
_ORIGINAL_BLOCKS, _DIFFUSERS_BLOCKS = "joint_blocks", "transformer_blocks"

TABLE = NameTable(
    top=_TOP,
    lists=((_ORIGINAL_BLOCKS, _DIFFUSERS_BLOCKS, _BLOCK),),
    model="SD3Transformer2DModel",
    # (shift, scale) in the original, (scale, shift) in diffusers' AdaLayerNormContinuous: the
    # final layer's, and the last block's context modulation, whose stream has no MLP
    # (sd3_models.MMDiT: the last block's context stream is pre-only).
    swapped=("final_layer.adaLN_modulation.1.weight", "final_layer.adaLN_modulation.1.bias"),
    swapped_without={"context_block.adaLN_modulation.1": "context_block.mlp.fc2.weight"},
    whole=("pos_embed",),  # the position table, a whole key
)
# Diffusers SD3Transformer2DModel state dict -> Stability's MMDiT keys, without a prefix;
# ValueError for a key it does not know or a fused tensor with a missing part.
transformer_to_original = TABLE.to_original
# Stability's MMDiT state dict (with or without model.diffusion_model.) -> diffusers keys;
# ValueError for a key that is not part of an SD3 MMDiT (a full checkpoint's other parts).
transformer_from_original = TABLE.from_original


# --- detection ----------------------------------------------------------------------------------


# Keys only an SD3 MMDiT has together: joint blocks with a context stream and a pooled-text
# embedder. FLUX.1 (double_blocks / single_blocks, img_in), SD and SDXL UNets (input_blocks),
# AuraFlow (no pooled input) have other names.
ORIGINAL_MARKS = (
    "x_embedder.proj.weight",
    "pos_embed",
    "y_embedder.mlp.0.weight",
    "context_embedder.weight",
    "joint_blocks.0.x_block.attn.qkv.weight",
    "joint_blocks.0.context_block.attn.qkv.weight",
)
DIFFUSERS_MARKS = (
    "pos_embed.proj.weight",
    "pos_embed.pos_embed",
    "time_text_embed.text_embedder.linear_1.weight",
    "context_embedder.weight",
    "transformer_blocks.0.attn.to_q.weight",
    "transformer_blocks.0.attn.add_q_proj.weight",
)


def _blocks(keys: Iterable[str], head: str) -> set[int]:
    pattern = re.compile(re.escape(head) + r"\.(\d+)\.")
    return {int(m.group(1)) for k in keys if (m := pattern.match(k))}


def variant_for(qk_norm: bool, dual: bool) -> Variant:
    """sd3_utils.analyze_state_dict_state's rule: no qk norm is SD3 Medium; of the SD3.5 models
    only Medium has dual-attention blocks."""
    if not qk_norm:
        return "sd3-medium"
    return "sd3.5-medium" if dual else "sd3.5-large"


def detect_sd3(keys: Iterable[str]) -> tuple[Layout, str] | None:
    """(layout, prefix of its keys) of an SD3 / SD3.5 MMDiT state dict (or a full checkpoint
    holding one), or None for anything else; by key names only (the family spec's main file
    finds them by the same marks)."""
    keys = set(keys)
    for layout, marks in (("diffusers", DIFFUSERS_MARKS), ("original", ORIGINAL_MARKS)):
        for prefix in ("", ORIGINAL_PREFIX):
            if all(prefix + k in keys for k in marks):
                return layout, prefix
    return None


# --- config from shapes ---------------------------------------------------------------------


def transformer_config_from_shapes(shapes: Mapping[str, tuple[int, ...]]) -> dict:
    """SD3Transformer2DModel kwargs for diffusers-named shapes: the full-size config of the
    variant they show (variant_for) with the widths, block count, position table, qk norm and
    dual-attention blocks the tensors show.

    The head width shows only in the qk norms' scales. Without them (SD3 Medium) it is SD3's 64
    when that divides the width, else a guess (with a warning). ``sample_size`` (not in any
    weight) stays SD3's 128 unless the position table is smaller.
    """
    norm = shapes.get("transformer_blocks.0.attn.norm_q.weight")
    dual = sorted(_blocks((k for k in shapes if ".attn2." in k), _DIFFUSERS_BLOCKS))
    base = sd3_shapes.transformer_config(variant_for(norm is not None, bool(dual)))
    width, in_channels, patch, _ = shapes["pos_embed.proj.weight"]
    guessed = ()
    if norm is not None:
        head_dim = norm[0]
    else:
        head_dim = next(
            d for d in (base["attention_head_dim"], 32, 16, 8, 4, 2, 1) if width % d == 0
        )
        guessed = ("num_attention_heads",) if head_dim != base["attention_head_dim"] else ()
    side = math.isqrt(shapes["pos_embed.pos_embed"][1])
    caption_in = shapes["context_embedder.weight"]
    config = {
        **base,
        "sample_size": min(base["sample_size"], side * patch),
        "patch_size": patch,
        "in_channels": in_channels,
        "num_layers": count_numbered(shapes, _DIFFUSERS_BLOCKS),
        "attention_head_dim": head_dim,
        "num_attention_heads": width // head_dim,
        "joint_attention_dim": caption_in[1],
        "caption_projection_dim": caption_in[0],
        "pooled_projection_dim": shapes["time_text_embed.text_embedder.linear_1.weight"][1],
        "out_channels": shapes["proj_out.weight"][0] // (patch * patch),
        "pos_embed_max_size": side,
        "dual_attention_layers": tuple(dual),
        "qk_norm": "rms_norm" if norm is not None else None,
    }
    if guessed:
        shape_configs.note_guesses("transformer", config, guessed)
    return config
