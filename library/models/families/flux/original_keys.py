"""FLUX.1 state dicts: the original Black Forest Labs names <-> diffusers names, both directions.

- Transformer: ``transformer_to_original`` / ``transformer_from_original``. The original layout is
  that of flux1-dev.safetensors and flux1-schnell.safetensors (``double_blocks.N.img_attn.qkv``,
  ``single_blocks.N.linear1``, ``img_in``, ...); ComfyUI-style full checkpoints put it under
  ``model.diffusion_model.``, which ``transformer_from_original`` strips. Fused projections are
  split (original -> diffusers) or concatenated (diffusers -> original): q|k|v in the double
  blocks, q|k|v|mlp-in in a single block's ``linear1``. The final layer's modulation holds
  (shift, scale) in the original and (scale, shift) in diffusers, so its halves are swapped.
- AE: ``ae_to_original`` / ``ae_from_original``. ae.safetensors uses SD's LDM VAE names without
  the ``first_stage_model.`` prefix and without quant convs, so library/models/original_names.py
  does the renaming.
- ``detect_flux``: which layout and variant a transformer file holds, from its key names.

All functions take a mapping of tensors and only cut, join and rename them, so they work on
meta tensors and on any dtype (fp8 included). ``convert_shapes`` runs them on key -> shape.
Split pieces are views of the fused tensor: clone them before saving them with safetensors.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Literal

import torch

from library.models.families.name_table import join_parts, swap_halves
from library.models.families.shape_origins import convert_shapes as convert_shapes
from library.models.original_names import vae_state_dict_from_original, vae_state_dict_to_original

ORIGINAL_PREFIX = "model.diffusion_model."

# Original parameter stem -> diffusers stem(s), in the order the original concatenates them.
# A stem stands for ``<stem>.weight`` and ``<stem>.bias``; keys ending in ".scale" (the RMSNorm
# scales of the q/k norms) are whole keys.
_TOP = {
    "img_in": "x_embedder",
    "txt_in": "context_embedder",
    "time_in.in_layer": "time_text_embed.timestep_embedder.linear_1",
    "time_in.out_layer": "time_text_embed.timestep_embedder.linear_2",
    "vector_in.in_layer": "time_text_embed.text_embedder.linear_1",
    "vector_in.out_layer": "time_text_embed.text_embedder.linear_2",
    "guidance_in.in_layer": "time_text_embed.guidance_embedder.linear_1",
    "guidance_in.out_layer": "time_text_embed.guidance_embedder.linear_2",
    "final_layer.linear": "proj_out",
    "final_layer.adaLN_modulation.1": "norm_out.linear",
}
_DOUBLE = {
    "img_mod.lin": "norm1.linear",
    "txt_mod.lin": "norm1_context.linear",
    "img_attn.qkv": ("attn.to_q", "attn.to_k", "attn.to_v"),
    "txt_attn.qkv": ("attn.add_q_proj", "attn.add_k_proj", "attn.add_v_proj"),
    "img_attn.norm.query_norm.scale": "attn.norm_q.weight",
    "img_attn.norm.key_norm.scale": "attn.norm_k.weight",
    "txt_attn.norm.query_norm.scale": "attn.norm_added_q.weight",
    "txt_attn.norm.key_norm.scale": "attn.norm_added_k.weight",
    "img_attn.proj": "attn.to_out.0",
    "txt_attn.proj": "attn.to_add_out",
    "img_mlp.0": "ff.net.0.proj",
    "img_mlp.2": "ff.net.2",
    "txt_mlp.0": "ff_context.net.0.proj",
    "txt_mlp.2": "ff_context.net.2",
}
_SINGLE = {
    "modulation.lin": "norm.linear",
    "linear1": ("attn.to_q", "attn.to_k", "attn.to_v", "proj_mlp"),
    "norm.query_norm.scale": "attn.norm_q.weight",
    "norm.key_norm.scale": "attn.norm_k.weight",
    "linear2": "proj_out",
}
# (original block list, diffusers block list, table)
_BLOCKS = (
    ("double_blocks", "transformer_blocks", _DOUBLE),
    ("single_blocks", "single_transformer_blocks", _SINGLE),
)
_SWAPPED = ("final_layer.adaLN_modulation.1.weight", "final_layer.adaLN_modulation.1.bias")


def _expand(table: Mapping[str, str | tuple[str, ...]]) -> dict[str, tuple[str, ...]]:
    """Stems -> whole keys: original key -> diffusers keys."""
    out = {}
    for old, new in table.items():
        new = (new,) if isinstance(new, str) else new
        if old.endswith(".scale"):
            out[old] = new
            continue
        for param in ("weight", "bias"):
            out[f"{old}.{param}"] = tuple(f"{n}.{param}" for n in new)
    return out


_TOP_KEYS = _expand(_TOP)
_BLOCK_KEYS = {old: (new, _expand(table)) for old, new, table in _BLOCKS}
# diffusers key (within its block) -> (original key, index in the fused tensor, parts)
_TOP_BACK = {n: (o, i, len(ns)) for o, ns in _TOP_KEYS.items() for i, n in enumerate(ns)}
_BLOCK_BACK = {
    new: (old, {n: (o, i, len(ns)) for o, ns in keys.items() for i, n in enumerate(ns)})
    for old, (new, keys) in _BLOCK_KEYS.items()
}


def _diffusers_source(key: str) -> tuple[str, int, int]:
    """Diffusers key -> (original key, index among the fused parts, number of parts)."""
    if key in _TOP_BACK:
        return _TOP_BACK[key]
    m = re.match(r"(\w+)\.(\d+)\.(.+)", key)
    if m and m.group(1) in _BLOCK_BACK:
        old, back = _BLOCK_BACK[m.group(1)]
        if m.group(3) in back:
            rest, index, parts = back[m.group(3)]
            return f"{old}.{m.group(2)}.{rest}", index, parts
    raise ValueError(f"{key!r} is not a key of a diffusers FluxTransformer2DModel")


def transformer_to_original(state: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Diffusers FluxTransformer2DModel state dict -> original (BFL) keys, without a prefix.

    Raises ValueError for a key it does not know or a fused tensor with a missing part.
    """
    out = join_parts((*_diffusers_source(key), value) for key, value in state.items())
    for key in _SWAPPED:
        if key in out:
            out[key] = swap_halves(out[key])
    return out


def _width(state: Mapping[str, torch.Tensor]) -> int:
    """The transformer's hidden size, from the shapes of an original-layout state dict."""
    if "img_in.weight" in state:
        return state["img_in.weight"].shape[0]
    for key, value in state.items():
        if key.endswith(".linear1.weight"):
            return value.shape[1]
    raise ValueError("cannot tell the hidden size: no img_in.weight or linear1.weight")


def transformer_from_original(state: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Original (BFL) transformer state dict -> diffusers FluxTransformer2DModel keys.

    Keys may carry the ``model.diffusion_model.`` prefix. Raises ValueError for a key that is not
    part of a FLUX.1 transformer (other components of a full checkpoint must be left out).
    """
    state = {k.removeprefix(ORIGINAL_PREFIX): v for k, v in state.items()}
    width = None
    out = {}
    for key, value in state.items():
        block, new_keys = None, _TOP_KEYS.get(key)
        m = re.match(r"(\w+)\.(\d+)\.(.+)", key)
        if new_keys is None and m and m.group(1) in _BLOCK_KEYS:
            new_block, table = _BLOCK_KEYS[m.group(1)]
            block, new_keys = f"{new_block}.{m.group(2)}.", table.get(m.group(3))
        if new_keys is None:
            raise ValueError(f"{key!r} is not a key of an original FLUX.1 transformer")
        if key in _SWAPPED:
            value = swap_halves(value)
        if len(new_keys) == 3:  # q|k|v of equal size
            pieces = value.chunk(3, dim=0)
        elif len(new_keys) == 4:  # q|k|v|mlp-in: three of the hidden size, the MLP's the rest
            width = width or _width(state)
            pieces = value.split([width] * 3 + [value.shape[0] - 3 * width], dim=0)
        else:
            pieces = (value,)
        for new, piece in zip(new_keys, pieces, strict=True):
            out[(block or "") + new] = piece
    return out


# --- AE ---------------------------------------------------------------------------------------


def _levels(state: Mapping[str, object], pattern: str) -> int:
    found = {int(m.group(1)) for k in state if (m := re.match(pattern, k))}
    if not found:
        raise ValueError("no encoder down blocks found: not an AE state dict")
    return max(found) + 1


def ae_to_original(state: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Diffusers AutoencoderKL state dict -> ae.safetensors keys (attention as 1x1 convs)."""
    return vae_state_dict_to_original(state, _levels(state, r"encoder\.down_blocks\.(\d+)\."))


def ae_from_original(state: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """ae.safetensors keys -> diffusers AutoencoderKL state dict (attention as matrices)."""
    return vae_state_dict_from_original(state, _levels(state, r"encoder\.down\.(\d+)\."))


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
_ORIGINAL_MARKS = (
    "img_in.weight",
    "vector_in.in_layer.weight",
    "double_blocks.0.img_attn.qkv.weight",
    "single_blocks.0.linear1.weight",
)
_DIFFUSERS_MARKS = (
    "x_embedder.weight",
    "time_text_embed.text_embedder.linear_1.weight",
    "transformer_blocks.0.attn.add_q_proj.weight",
    "single_transformer_blocks.0.proj_mlp.weight",
)


def _count(keys: Iterable[str], head: str) -> int:
    pattern = re.compile(re.escape(head) + r"\.(\d+)\.")
    found = {int(m.group(1)) for k in keys if (m := pattern.match(k))}
    return max(found) + 1 if found else 0


def detect_flux(keys: Iterable[str]) -> FluxKeys | None:
    """The layout and variant of a FLUX.1 transformer state dict, or None for anything else.

    By key names only, so FLUX.1 Fill / Depth (more input channels) read as dev.
    """
    keys = set(keys)
    for prefix in ("", ORIGINAL_PREFIX):
        if all(prefix + k in keys for k in _ORIGINAL_MARKS):
            dev = prefix + "guidance_in.in_layer.weight" in keys
            double = _count(keys, prefix + "double_blocks")
            single = _count(keys, prefix + "single_blocks")
            return FluxKeys("original", "dev" if dev else "schnell", prefix, double, single)
    if all(k in keys for k in _DIFFUSERS_MARKS):
        dev = "time_text_embed.guidance_embedder.linear_1.weight" in keys
        double = _count(keys, "transformer_blocks")
        single = _count(keys, "single_transformer_blocks")
        return FluxKeys("diffusers", "dev" if dev else "schnell", "", double, single)
    return None
