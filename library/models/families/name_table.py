"""An original <-> diffusers name table as data, and the converters both ways built from it.

A family whose single files use the original repository's names declares them as stems:
``"img_attn.qkv": ("attn.to_q", "attn.to_k", "attn.to_v")`` says the original fused tensor
``img_attn.qkv.{weight,bias}`` holds diffusers' three in that order (rows stacked); a stem whose
last part is ``scale`` (an RMSNorm's) is a whole key. Top-level stems and numbered lists
(``double_blocks.<i>.*`` <-> ``transformer_blocks.<i>.*``) are given separately. From that one
table come both converters (``from_original`` splits fused tensors, ``to_original`` joins them),
the block groups a streamed save converts one at a time, and the key marks that tell the two
layouts apart. The converters only cut, join and rename, so they run on meta tensors (shapes
checked before any weight is read) and any dtype.

The dual-stream and single-stream block tables of the MM-DiT transformers whose original
repositories fuse q|k|v (and, in a single-stream block, the MLP input) are shared here too
(``DUAL_STREAM_BLOCK``, ``SINGLE_STREAM_BLOCK``, their per-block modulation apart): a family
takes them and adds its own stems.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

import torch

Stem = str | tuple[str, ...]
# Original checkpoints' prefix of the denoiser in a full (ComfyUI-style) checkpoint.
CHECKPOINT_PREFIX = "model.diffusion_model."

# A dual-stream block: image and text streams with their own weights, joint attention.
DUAL_STREAM_BLOCK: dict[str, Stem] = {  # in kohya's order of the Linears
    "img_attn.qkv": ("attn.to_q", "attn.to_k", "attn.to_v"),
    "img_attn.norm.query_norm.scale": "attn.norm_q.weight",
    "img_attn.norm.key_norm.scale": "attn.norm_k.weight",
    "img_attn.proj": "attn.to_out.0",
    "img_mlp.0": "ff.net.0.proj",
    "img_mlp.2": "ff.net.2",
    "txt_attn.qkv": ("attn.add_q_proj", "attn.add_k_proj", "attn.add_v_proj"),
    "txt_attn.norm.query_norm.scale": "attn.norm_added_q.weight",
    "txt_attn.norm.key_norm.scale": "attn.norm_added_k.weight",
    "txt_attn.proj": "attn.to_add_out",
    "txt_mlp.0": "ff_context.net.0.proj",
    "txt_mlp.2": "ff_context.net.2",
}
# A single-stream block: linear1 holds q|k|v and the MLP input, linear2 attention out and MLP out.
SINGLE_STREAM_BLOCK: dict[str, Stem] = {
    "linear1": ("attn.to_q", "attn.to_k", "attn.to_v", "proj_mlp"),
    "norm.query_norm.scale": "attn.norm_q.weight",
    "norm.key_norm.scale": "attn.norm_k.weight",
    "linear2": "proj_out",
}
_NUMBERED = re.compile(r"(.+?)\.(\d+)\.(.+)")
# A stem ending so is a whole key (an RMSNorm's scale, a single weight), not a Linear's stem.
_WHOLE = ("scale", "weight", "bias")


def _is_whole(stem: str, whole: Iterable[str] = ()) -> bool:
    return stem.rsplit(".", 1)[-1] in _WHOLE or stem in whole


def _expand(table: Mapping[str, Stem], whole: Iterable[str] = ()) -> dict[str, tuple[str, ...]]:
    """Stems -> whole keys: original key -> diffusers keys."""
    out = {}
    for old, new in table.items():
        new = (new,) if isinstance(new, str) else new
        if _is_whole(old, whole):
            out[old] = new
            continue
        for param in ("weight", "bias"):
            out[f"{old}.{param}"] = tuple(f"{n}.{param}" for n in new)
    return out


def _back(keys: Mapping[str, tuple[str, ...]]) -> dict[str, tuple[str, int, int]]:
    """diffusers key -> (original key, index among the fused parts, number of parts)."""
    return {n: (o, i, len(ns)) for o, ns in keys.items() for i, n in enumerate(ns)}


def swap_halves(tensor: torch.Tensor) -> torch.Tensor:
    """The tensor with its two halves along dim 0 exchanged ((shift, scale) <-> (scale, shift))."""
    first, second = tensor.chunk(2, dim=0)
    return torch.cat([second, first], dim=0)


def join_parts(parts: Iterable[tuple[str, int, int, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """Original state dict from (original key, part index, part count, tensor) of each diffusers
    tensor: parts of one fused tensor are stacked by rows in index order, at the position of
    the first part met. ValueError when a fused tensor lacks a part."""
    out: dict[str, torch.Tensor | None] = {}
    pieces: dict[str, list[torch.Tensor | None]] = {}
    for old, index, count, value in parts:
        if count == 1:
            out[old] = value
            continue
        out.setdefault(old, None)  # keeps the first part's position in the key order
        pieces.setdefault(old, [None] * count)[index] = value
    for old, stack in pieces.items():
        if any(p is None for p in stack):
            raise ValueError(f"cannot build {old!r}: some of its diffusers parts are missing")
        out[old] = torch.cat(stack, dim=0)
    return out


@dataclass(frozen=True)
class NameTable:
    """A model's original <-> diffusers names (module docstring).

    ``top``: stems outside numbered lists; ``lists``: (original list, diffusers list, stems of
    one entry); ``swapped``: original keys whose two halves are in the other order in diffusers
    (an adaLN's shift/scale); ``model``: the diffusers class, as messages name it; ``width_key``:
    the original key whose rows are the hidden size (a 4-way fused split needs it);
    ``same_elsewhere``: a name the table does not list is the same on both sides (else it is
    refused as not the model's); ``whole``: further stems that are whole keys (a modulation
    table named like a Linear); ``rows``: stems of whole keys the original stores flat, with
    the number of rows of the diffusers tensor; ``swapped_without``: stems of a list entry whose
    halves are swapped only in an entry lacking the given key (an entry whose stream ends
    early: its modulation is (shift, scale) like a final layer's)."""

    top: Mapping[str, Stem]
    lists: tuple[tuple[str, str, Mapping[str, Stem]], ...]
    model: str
    swapped: tuple[str, ...] = ()
    width_key: str = "img_in.weight"
    same_elsewhere: bool = False
    whole: tuple[str, ...] = ()
    rows: Mapping[str, int] = field(default_factory=dict)
    swapped_without: Mapping[str, str] = field(default_factory=dict)
    _top: dict = field(init=False, repr=False, compare=False)
    _lists: dict = field(init=False, repr=False, compare=False)
    _top_back: dict = field(init=False, repr=False, compare=False)
    _lists_back: dict = field(init=False, repr=False, compare=False)

    def __post_init__(self):
        top = _expand(self.top, self.whole)
        lists = {old: (new, _expand(stems, self.whole)) for old, new, stems in self.lists}
        back = {new: (old, _back(keys)) for old, (new, keys) in lists.items()}
        for name, value in (("_top", top), ("_lists", lists), ("_top_back", _back(top))):
            object.__setattr__(self, name, value)
        object.__setattr__(self, "_lists_back", back)

    @property
    def block_groups(self) -> tuple[str, ...]:
        """The diffusers lists a streamed save converts one entry at a time."""
        return tuple(f"{new}." for _old, new, _stems in self.lists)

    def linears(self, original_list: str | None) -> tuple[tuple[str, tuple[str, ...]], ...]:
        """(original stem, its diffusers stems in row order) of each Linear of an entry of the
        numbered list ``original_list`` (None: of the top level), in the table's order (RMSNorm
        scales left out)."""
        stems = (
            self.top
            if original_list is None
            else next(stems for old, _new, stems in self.lists if old == original_list)
        )
        return tuple(
            (old, (new,) if isinstance(new, str) else tuple(new))
            for old, new in stems.items()
            if not _is_whole(old, self.whole)
        )

    def original_group(self, key: str, prefix: str = "") -> str:
        """The numbered entry (``double_blocks.3.``) an original ``key`` belongs to, "" for a
        top-level key: each entry's fused tensors convert with its own keys."""
        m = _NUMBERED.match(key[len(prefix) :]) if key.startswith(prefix) else None
        return f"{prefix}{m.group(1)}.{m.group(2)}." if m and m.group(1) in self._lists else ""

    def _source(self, key: str) -> tuple[str, int, int]:
        if key in self._top_back:
            return self._top_back[key]
        m = _NUMBERED.match(key)
        if m and m.group(1) in self._lists_back:
            old, inner = self._lists_back[m.group(1)]
            if m.group(3) in inner:
                rest, index, parts = inner[m.group(3)]
                return f"{old}.{m.group(2)}.{rest}", index, parts
        if self.same_elsewhere:
            return key, 0, 1
        raise ValueError(f"{key!r} is not a key of a diffusers {self.model}")

    def original_key(self, key: str) -> str:
        """The original key holding the diffusers ``key`` (a fused tensor for each part)."""
        return self._source(key)[0]

    def diffusers_keys(self, key: str) -> tuple[str, ...]:
        """The diffusers keys the original ``key`` (without a prefix) becomes, in row order."""
        new_keys, m = self._top.get(key), _NUMBERED.match(key)
        if new_keys is None and m and m.group(1) in self._lists:
            new_list, keys = self._lists[m.group(1)]
            found = keys.get(m.group(3))
            new_keys = tuple(f"{new_list}.{m.group(2)}.{k}" for k in found) if found else None
        if new_keys is None and self.same_elsewhere:
            return (key,)
        if new_keys is None:
            raise ValueError(f"{key!r} is not a key of an original {self.model}")
        return new_keys

    def to_original(self, state: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Diffusers state dict -> original keys, without a prefix. ValueError for a key it
        does not know or a fused tensor with a missing part."""
        out = join_parts((*self._source(key), value) for key, value in state.items())
        for key in self._swaps(out):
            out[key] = swap_halves(out[key])
        for key, value in out.items():
            if self._stem(key) in self.rows:
                out[key] = value.reshape(-1)
        return out

    def _swaps(self, keys: Iterable[str]) -> set[str]:
        """The original keys among ``keys`` whose two halves are in the other order in
        diffusers: ``swapped`` ones, and ``swapped_without`` ones in an entry lacking its key."""
        keys = set(keys)
        found = keys.intersection(self.swapped)
        for key in keys:
            m = _NUMBERED.match(key)
            lacking = self.swapped_without.get(m.group(3).rsplit(".", 1)[0]) if m else None
            if lacking and f"{m.group(1)}.{m.group(2)}.{lacking}" not in keys:
                found.add(key)
        return found

    def _stem(self, key: str) -> str:
        """An original key's stem: within its numbered entry, else the key."""
        m = _NUMBERED.match(key)
        return m.group(3) if m and m.group(1) in self._lists else key

    def _width(self, state: Mapping[str, torch.Tensor]) -> int:
        if self.width_key in state:
            return state[self.width_key].shape[0]
        for key, value in state.items():
            if key.endswith(".linear1.weight"):
                return value.shape[1]
        raise ValueError(f"cannot tell the hidden size: no {self.width_key} or linear1.weight")

    def from_original(self, state: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Original state dict (with or without ``model.diffusion_model.``) -> diffusers keys.
        ValueError for a key that is not part of the model."""
        state = {k.removeprefix(CHECKPOINT_PREFIX): v for k, v in state.items()}
        width, out, swaps = None, {}, self._swaps(state)
        for key, value in state.items():
            new_keys = self.diffusers_keys(key)
            if key in swaps:
                value = swap_halves(value)
            if self._stem(key) in self.rows:
                value = value.reshape(self.rows[self._stem(key)], -1)
            if len(new_keys) == 4:  # q|k|v|mlp-in: three of the hidden size, the MLP's the rest
                width = width or self._width(state)
                pieces = value.split([width] * 3 + [value.shape[0] - 3 * width], dim=0)
            else:  # q|k|v (or any fused parts) of equal size
                pieces = value.chunk(len(new_keys), dim=0) if len(new_keys) > 1 else (value,)
            if len(new_keys) == 3 and value.shape[0] % 3:
                raise ValueError(f"{key}: {tuple(value.shape)} does not split into q, k and v")
            for new, piece in zip(new_keys, pieces, strict=True):
                out[new] = piece
        return out


def count_numbered(keys: Iterable[str], head: str) -> int:
    """How many entries the numbered list ``head`` (``transformer_blocks``) has among ``keys``:
    one more than the highest index; 0 when there is none."""
    pattern = re.compile(re.escape(head) + r"\.(\d+)\.")
    found = {int(m.group(1)) for k in keys if (m := pattern.match(k))}
    return max(found) + 1 if found else 0


def dual_single_sizes(shapes: Mapping[str, tuple[int, ...]]) -> dict[str, int]:
    """The sizes every dual/single-stream transformer's diffusers-named ``shapes`` show, as its
    config names them: the input channels, both block counts, the head width (its q norm's) and
    count, and the text width (``context_embedder``'s input); KeyError naming a missing key."""
    inner, channels = shapes["x_embedder.weight"]
    head = next(v for k, v in shapes.items() if k.endswith(".attn.norm_q.weight"))[0]
    return {
        "in_channels": channels,
        "num_layers": count_numbered(shapes, "transformer_blocks"),
        "num_single_layers": count_numbered(shapes, "single_transformer_blocks"),
        "attention_head_dim": head,
        "num_attention_heads": inner // head,
        "joint_attention_dim": shapes["context_embedder.weight"][1],
    }
