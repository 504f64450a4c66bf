"""Chroma transformer state dicts: the original names <-> diffusers names, both directions.

The original layout is that of lodestones' released files (Chroma1-HD.safetensors, the
chroma-unlocked checkpoints) and ComfyUI's Chroma model: FLUX.1's block names without the
modulation Linears and without the time/vector/guidance embedders, plus the
``distilled_guidance_layer`` (``in_proj``, ``layers.<i>.in_layer`` / ``out_layer``,
``norms.<i>.scale``, ``out_proj``). Full checkpoints put it under ``model.diffusion_model.``,
which ``transformer_from_original`` strips. Fused projections are split (original -> diffusers)
or concatenated (diffusers -> original): q|k|v in the double blocks, q|k|v|mlp-in in a single
block's ``linear1``. The final layer has no modulation Linear (its shift and scale come from the
distilled guidance layer), so nothing is swapped. Checked against diffusers'
``convert_chroma_transformer_checkpoint_to_diffusers`` (tests/conformance).

The functions only cut, join and rename, so they work on meta tensors and any dtype.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

import torch

from library.models.families.flux.original_keys import ORIGINAL_PREFIX, join_parts

GUIDANCE = "distilled_guidance_layer"
# Original stem -> diffusers stem(s) in the order the original concatenates them; a stem stands
# for <stem>.weight and <stem>.bias, a key ending in "scale" (RMSNorm scales) is a whole key.
_TOP = {
    "img_in": "x_embedder",
    "txt_in": "context_embedder",
    "final_layer.linear": "proj_out",
    f"{GUIDANCE}.in_proj": f"{GUIDANCE}.in_proj",
    f"{GUIDANCE}.out_proj": f"{GUIDANCE}.out_proj",
}
_DOUBLE = {
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
    "linear1": ("attn.to_q", "attn.to_k", "attn.to_v", "proj_mlp"),
    "norm.query_norm.scale": "attn.norm_q.weight",
    "norm.key_norm.scale": "attn.norm_k.weight",
    "linear2": "proj_out",
}
# (original list, diffusers list, table of one numbered entry)
_LISTS = (
    ("double_blocks", "transformer_blocks", _DOUBLE),
    ("single_blocks", "single_transformer_blocks", _SINGLE),
    (f"{GUIDANCE}.layers", f"{GUIDANCE}.layers", {"in_layer": "linear_1", "out_layer": "linear_2"}),
    (f"{GUIDANCE}.norms", f"{GUIDANCE}.norms", {"scale": "weight"}),
)
_NUMBERED = re.compile(r"(.+?)\.(\d+)\.(.+)")


def _expand(table: Mapping[str, str | tuple[str, ...]]) -> dict[str, tuple[str, ...]]:
    out = {}
    for old, new in table.items():
        new = (new,) if isinstance(new, str) else new
        if old == "scale" or old.endswith(".scale"):
            out[old] = new
            continue
        for param in ("weight", "bias"):
            out[f"{old}.{param}"] = tuple(f"{n}.{param}" for n in new)
    return out


_TOP_KEYS = _expand(_TOP)
_LIST_KEYS = {old: (new, _expand(table)) for old, new, table in _LISTS}
_TOP_BACK = {n: (o, i, len(ns)) for o, ns in _TOP_KEYS.items() for i, n in enumerate(ns)}
_LIST_BACK = {
    new: (old, {n: (o, i, len(ns)) for o, ns in keys.items() for i, n in enumerate(ns)})
    for old, (new, keys) in _LIST_KEYS.items()
}
# Block groups of a diffusers state dict that convert on their own (saving.streamed).
BLOCK_GROUPS = ("transformer_blocks.", "single_transformer_blocks.")


def _diffusers_source(key: str) -> tuple[str, int, int]:
    if key in _TOP_BACK:
        return _TOP_BACK[key]
    m = _NUMBERED.match(key)
    if m and m.group(1) in _LIST_BACK:
        old, back = _LIST_BACK[m.group(1)]
        if m.group(3) in back:
            rest, index, parts = back[m.group(3)]
            return f"{old}.{m.group(2)}.{rest}", index, parts
    raise ValueError(f"{key!r} is not a key of a diffusers ChromaTransformer2DModel")


def transformer_to_original(state: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Diffusers ChromaTransformer2DModel state dict -> original keys, without a prefix.
    ValueError for a key it does not know or a fused tensor with a missing part."""
    return join_parts((*_diffusers_source(key), value) for key, value in state.items())


def _width(state: Mapping[str, torch.Tensor]) -> int:
    if "img_in.weight" in state:
        return state["img_in.weight"].shape[0]
    for key, value in state.items():
        if key.endswith(".linear1.weight"):
            return value.shape[1]
    raise ValueError("cannot tell the hidden size: no img_in.weight or linear1.weight")


def transformer_from_original(state: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Original Chroma transformer state dict (with or without ``model.diffusion_model.``) ->
    diffusers ChromaTransformer2DModel keys. ValueError for a key that is not part of one."""
    state = {k.removeprefix(ORIGINAL_PREFIX): v for k, v in state.items()}
    width = None
    out = {}
    for key, value in state.items():
        prefix, new_keys = "", _TOP_KEYS.get(key)
        m = _NUMBERED.match(key)
        if new_keys is None and m and m.group(1) in _LIST_KEYS:
            new_list, table = _LIST_KEYS[m.group(1)]
            prefix, new_keys = f"{new_list}.{m.group(2)}.", table.get(m.group(3))
        if new_keys is None:
            raise ValueError(f"{key!r} is not a key of an original Chroma transformer")
        if len(new_keys) == 3:
            pieces = value.chunk(3, dim=0)
        elif len(new_keys) == 4:
            width = width or _width(state)
            pieces = value.split([width] * 3 + [value.shape[0] - 3 * width], dim=0)
        else:
            pieces = (value,)
        for new, piece in zip(new_keys, pieces, strict=True):
            out[prefix + new] = piece
    return out


# Keys only a Chroma transformer has together (the distilled guidance layer and FLUX.1's
# blocks), in each layout.
_ORIGINAL_MARKS = (f"{GUIDANCE}.in_proj.weight", "double_blocks.0.img_attn.qkv.weight")
_DIFFUSERS_MARKS = (f"{GUIDANCE}.in_proj.weight", "transformer_blocks.0.attn.add_q_proj.weight")


def detect_chroma(keys: Iterable[str]) -> tuple[str, str] | None:
    """(layout "original" or "diffusers", the prefix of its keys) of a Chroma transformer
    state dict, or None for anything else; by key names only."""
    keys = set(keys)
    for prefix in ("", ORIGINAL_PREFIX):
        if all(prefix + k in keys for k in _ORIGINAL_MARKS):
            return "original", prefix
    if all(k in keys for k in _DIFFUSERS_MARKS):
        return "diffusers", ""
    return None
