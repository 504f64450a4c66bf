"""kohya's block-wise ``network_args`` of ``networks.lora``: block numbers, lr weights, ranks.

sd-scripts numbers the blocks of an SD UNet in the order of the original (LDM/SGM) layout and
lets ``network_args`` give each block a learning-rate weight (``down_lr_weight``,
``mid_lr_weight``, ``up_lr_weight``, ``block_lr_zero_threshold``) and a rank and alpha
(``block_dims``, ``block_alphas``, ``conv_block_dims``, ``conv_block_alphas``). This module holds
those rules as pure functions over kohya module names (``lora_unet_...``, see
library/networks/kohya_keys.py); it builds nothing.

The blocks, by index:

- SD 1.x/2.x, 25 blocks: 0-11 the input (down) blocks 0-11, 12 the middle block, 13-24 the output
  (up) blocks 0-11. Names are diffusers paths; kohya derives the block from them as if every
  level had two ResNets (``down_blocks.i.{resnets,attentions}.j`` -> ``1 + 3i + j``,
  ``down_blocks.i.downsamplers.0`` -> ``3 + 3i``, ``up_blocks.i.{resnets,attentions}.j`` ->
  ``13 + 3i + j``, ``up_blocks.i.upsamplers.0`` -> ``15 + 3i``, anything in ``mid_block`` -> 12).
  Block 0 is ``conv_in``, which a networks.lora LoRA never adapts, so the first value of
  ``down_lr_weight`` / ``block_dims`` has no module to act on.
- SDXL, 23 blocks: 0 the time and label (size) embeddings, 1-9 ``input_blocks`` 0-8, 10-12
  ``middle_block`` 0-2, 13-21 ``output_blocks`` 0-8, 22 the output head (``out``). Names use the
  original SGM layout, as difftune writes them. Blocks 0 and 22 hold no networks.lora modules
  and their lr weight is always 1; block 1 (``input_blocks.0``, ``conv_in``) has none either, so
  the first value of ``down_lr_weight`` acts on nothing here too.

Outside the numbered blocks (``block_index`` gives None): text-encoder modules (``lora_te*``;
kohya gives them ``network_dim`` / ``network_alpha`` and the text-encoder learning rate, never a
block setting) and, on SD 1.x/2.x, the UNet's top-level layers (``conv_in``, ``conv_out``,
``conv_norm_out``, ``time_embedding``, ``add_embedding`` / ``class_embedding``), none of which a
networks.lora LoRA adapts.
"""

from __future__ import annotations

import json
import logging
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal, NamedTuple

log = logging.getLogger(__name__)

Kind = Literal["linear", "conv"]

PRESETS = ("sine", "cosine", "linear", "reverse_linear", "zeros")
LR_KEYS = ("down_lr_weight", "mid_lr_weight", "up_lr_weight")
RANK_KEYS = ("block_dims", "block_alphas", "conv_block_dims", "conv_block_alphas")
BLOCKWISE_KEYS = (*LR_KEYS, "block_lr_zero_threshold", *RANK_KEYS)

# Input (= output) blocks and middle blocks kohya counts per family.
_SIDE = {False: 12, True: 9}
_MID = {False: 1, True: 3}

_SD_UPDOWN = re.compile(
    r"lora_unet_(down|up)_blocks_(\d+)_(resnets|attentions|downsamplers|upsamplers)_(\d+)_"
)
_SDXL_BLOCK = re.compile(r"lora_unet_(input_blocks|middle_block|output_blocks)_(\d+)_")


def num_blocks(sdxl: bool) -> int:
    """How many blocks kohya numbers: 25 for SD 1.x/2.x, 23 for SDXL."""
    return 2 * _SIDE[sdxl] + _MID[sdxl] + (2 if sdxl else 0)


def _family(sdxl: bool) -> str:
    return "SDXL" if sdxl else "SD 1.x/2.x"


def _all_blocks(sdxl: bool) -> str:
    """The blocks of ``num_blocks(sdxl)`` in order, in words."""
    if sdxl:
        return (
            "the time/label embedding, input blocks 0-8, middle blocks 0-2, output blocks 0-8 "
            "and the out layer"
        )
    return "input blocks 0-11, the middle block and output blocks 0-11"


def _show(value: object) -> str:
    return json.dumps(value, default=str)


# --- block index ----------------------------------------------------------------------------


def block_index(kohya_name: str, sdxl: bool) -> int | None:
    """kohya's block index of a UNet LoRA module name (``lora_unet_...``), or None.

    See the module docstring for the numbering and for the names outside the numbered blocks
    (None). SD 1.x/2.x names are diffusers paths (``lora_unet_down_blocks_1_attentions_0_proj_in``
    -> 4); SDXL names are SGM paths (``lora_unet_input_blocks_4_1_proj_in`` -> 5,
    ``lora_unet_middle_block_1_...`` -> 11, ``lora_unet_output_blocks_2_...`` -> 15). A name of
    the other family's layout is outside too (None). Raises ValueError for a block name whose
    number lies past kohya's table (a UNet with more levels or ResNets than SD's), where kohya
    would silently give it another block's settings.
    """
    if sdxl:
        return _sdxl_index(kohya_name)
    return _sd_index(kohya_name)


def _sd_index(name: str) -> int | None:
    if name.startswith("lora_unet_mid_block_"):
        return _SIDE[False]
    m = _SD_UPDOWN.match(name)
    if m is None:
        return None
    side, level, kind, j = m.group(1), int(m.group(2)), m.group(3), int(m.group(4))
    sampler = kind in ("downsamplers", "upsamplers")
    # Two ResNets (and attentions) then the sampler per down level, three per up level.
    slots = 2 if side == "down" else 3
    fits = level < 4 and (j == 0 if sampler else j < slots)
    if side == "down":
        index = 1 + 3 * level + (2 if sampler else j)
        fits = fits and index < _SIDE[False]
    else:
        index = _SIDE[False] + 1 + 3 * level + (2 if sampler else j)
    if not fits:
        raise ValueError(
            f"{name}: {side}_blocks.{level}.{kind}.{j} has no block in kohya's SD 1.x/2.x "
            "numbering (4 levels, 2 ResNets per down level, 3 per up level); block-wise "
            "network_args need an SD-shaped UNet, remove them for this model"
        )
    return index


def _sdxl_index(name: str) -> int | None:
    rest = name.removeprefix("lora_unet_")
    if rest == name:
        return None
    if rest.startswith(("time_embed_", "label_emb_")):
        return 0
    if rest.startswith("out_"):
        return num_blocks(True) - 1
    m = _SDXL_BLOCK.match(name)
    if m is None:
        return None
    part, number = m.group(1), int(m.group(2))
    limit, first = {
        "input_blocks": (_SIDE[True], 1),
        "middle_block": (_MID[True], 1 + _SIDE[True]),
        "output_blocks": (_SIDE[True], 1 + _SIDE[True] + _MID[True]),
    }[part]
    if number >= limit:
        raise ValueError(
            f"{name}: {part}.{number} has no block in kohya's SDXL numbering ({_all_blocks(True)}); "
            "block-wise network_args need an SDXL-shaped UNet, remove them for this model"
        )
    return first + number


# --- values -----------------------------------------------------------------------------------


def _number(key: str, value: object, hint: str) -> float:
    """``value`` (a number, or a string of one) as a finite float; ValueError naming ``key``."""
    if isinstance(value, str):
        try:
            value = float(value.strip())
        except ValueError:
            raise ValueError(f"{key} {_show(value)} is not a number; {hint}") from None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{key} {_show(value)} is not a number; {hint}")
    if not math.isfinite(value):
        raise ValueError(f"{key} {_show(value)} is not a finite number; {hint}")
    return float(value)


def _numbers(key: str, value: object, hint: str) -> tuple[list[float], bool]:
    """(numbers, given as one scalar) of a number, a list/tuple or a comma-separated string."""
    if isinstance(value, str):
        parts = value.strip().strip("()[]").split(",")
        if len(parts) > 1 and not parts[-1].strip():
            parts = parts[:-1]
        if any(not p.strip() for p in parts):
            raise ValueError(f"{key} {_show(value)} has an empty value in its list; {hint}")
        return [_number(key, p, hint) for p in parts], len(parts) == 1
    if isinstance(value, (list, tuple)):
        if not value:
            raise ValueError(f"{key} is an empty list; {hint}")
        return [_number(key, v, hint) for v in value], False
    return [_number(key, value, hint)], True


def _ranks(key: str, value: object, n: int, hint: str) -> list[int]:
    """A list of ``n`` ranks (integers >= 0) for ``key``."""
    numbers, _ = _numbers(key, value, hint)
    _check_count(key, numbers, n, hint)
    for i, number in enumerate(numbers):
        if number != int(number) or number < 0:
            raise ValueError(
                f"{key} value {i} (block {i}) is {_show(number)}; ranks are whole numbers >= 0 "
                "(0 leaves the block without LoRA)"
            )
    return [int(v) for v in numbers]


def _check_count(key: str, values: Sequence, n: int, hint: str) -> None:
    if len(values) != n:
        raise ValueError(f"{key} has {len(values)} values; {hint}")


# --- learning-rate weights --------------------------------------------------------------------


def preset_weights(name: str, n: int, offset: float = 0.0) -> list[float]:
    """kohya's lr-weight curves over ``n`` blocks, shallow to deep for down, deep to shallow
    for up: "sine" rises as sin(pi/2 * i/(n-1)) from 0 to 1, "cosine" is the same curve reversed
    (1 to 0), "linear" rises as i/(n-1), "reverse_linear" falls, "zeros" is 0; ``offset`` (the
    "+number" of "cosine+0.5") is added to every value."""
    rising = [i / (n - 1) for i in range(n)]
    if name in ("sine", "cosine"):
        rising = [math.sin(math.pi * x / 2) for x in rising]
    elif name == "zeros":
        rising = [0.0] * n
    elif name not in ("linear", "reverse_linear"):
        raise ValueError(f"unknown lr-weight preset {name!r}; use one of {', '.join(PRESETS)}")
    curve = rising[::-1] if name in ("cosine", "reverse_linear") else rising
    return [w + offset for w in curve]


def _side_hint(key: str, sdxl: bool) -> str:
    n = _SIDE[sdxl]
    blocks = "input" if key == "down_lr_weight" else "output"
    return (
        f"give {n} numbers (one per {_family(sdxl)} {blocks} block 0-{n - 1}), one number for "
        f'all of them, or a preset ({", ".join(PRESETS)}, optionally with "+offset" as in '
        '"cosine+0.5")'
    )


def _mid_hint(sdxl: bool) -> str:
    if sdxl:
        return "give 3 numbers (SDXL middle blocks 0-2; presets are for down/up_lr_weight only)"
    return "give 1 number (the SD 1.x/2.x middle block; presets are for down/up_lr_weight only)"


def _side_weights(key: str, value: object, sdxl: bool) -> list[float]:
    n, hint = _SIDE[sdxl], _side_hint(key, sdxl)
    if isinstance(value, str):
        name, plus, offset = value.strip().partition("+")
        if name.strip() in PRESETS:
            shift = 0.0
            if plus:
                try:
                    shift = float(offset.strip())
                except ValueError:
                    shift = math.nan
                if not math.isfinite(shift):
                    raise ValueError(
                        f'{key} {_show(value)}: the offset after "+" is not a number; write it '
                        f'as in "{name.strip()}+0.5"'
                    )
            return preset_weights(name.strip(), n, shift)
    weights, single = _numbers(key, value, hint)
    if single:
        # kohya stops with an error here (it takes the number for an unknown preset); difftune
        # gives every block of the side this weight.
        return weights * n
    return _fit(key, weights, n, hint)


def _fit(key: str, weights: list[float], n: int, hint: str) -> list[float]:
    """kohya fills a short list with 1.0 (with a warning); a long one is refused here, where
    kohya would drop the extra values."""
    if len(weights) > n:
        raise ValueError(f"{key} has {len(weights)} values, {len(weights) - n} too many; {hint}")
    if len(weights) < n:
        log.warning(
            "%s has %d of %d values; the last %d are 1 (as kohya fills them)",
            key,
            len(weights),
            n,
            n - len(weights),
        )
    return weights + [1.0] * (n - len(weights))


def lr_weights(
    down: object,
    mid: object,
    up: object,
    zero_threshold: object = None,
    *,
    sdxl: bool,
) -> list[float] | None:
    """Per-block learning-rate multipliers (``num_blocks(sdxl)`` values), or None when none of
    down/mid/up is set (kohya then trains the UNet as one group at the UNet rate).

    Values are as ``library.config.kohya.parse_kv_args`` gives them (also lists and
    comma-separated strings). ``down`` and ``up``: a preset ("sine", "cosine", "linear",
    "reverse_linear", "zeros", optionally "+offset"), a list of up to 12 numbers (SDXL 9) for
    input blocks 0.. / output blocks 0.., or one number for every block of that side. ``mid``:
    numbers only, 1 (SDXL 3). A short list is filled with 1.0 (with a warning), as kohya does; a
    long one is refused. An unset side is 1.0 everywhere. In the lists that are set, every
    weight at or below ``zero_threshold`` (default 0, so negative weights too) becomes 0, which
    removes the block's modules; the SDXL embedding and out blocks are always 1.
    Raises ValueError naming the key, the expected count and the fix.
    """
    if down is None and mid is None and up is None:
        return None
    threshold = 0.0
    if zero_threshold is not None:
        threshold = _number(
            "block_lr_zero_threshold", zero_threshold, "give one number (default 0)"
        )
    weights: list[float] = []
    for key, value in (("down_lr_weight", down), ("mid_lr_weight", mid), ("up_lr_weight", up)):
        if value is None:  # unset: 1 everywhere, never zeroed by the threshold
            weights += [1.0] * (_MID[sdxl] if key == "mid_lr_weight" else _SIDE[sdxl])
            continue
        part = (
            _mid_weights(value, sdxl) if key == "mid_lr_weight" else _side_weights(key, value, sdxl)
        )
        weights += [w if w > threshold else 0.0 for w in part]
    return [1.0, *weights, 1.0] if sdxl else weights


def _mid_weights(value: object, sdxl: bool) -> list[float]:
    hint = _mid_hint(sdxl)
    if isinstance(value, str) and value.strip().partition("+")[0].strip() in PRESETS:
        raise ValueError(f"mid_lr_weight {_show(value)} is a preset; {hint}")
    weights, _ = _numbers("mid_lr_weight", value, hint)
    return _fit("mid_lr_weight", weights, _MID[sdxl], hint)


# --- ranks ------------------------------------------------------------------------------------


class BlockRank(NamedTuple):
    """Rank and alpha of one block: Linear/1x1 layers, and 3x3 convs (None: no conv LoRA)."""

    dim: int
    alpha: float
    conv_dim: int | None
    conv_alpha: float | None


def block_ranks(
    block_dims: object,
    block_alphas: object,
    conv_block_dims: object,
    conv_block_alphas: object,
    dim: int,
    alpha: float,
    conv_dim: int | None = None,
    conv_alpha: float | None = None,
    *,
    sdxl: bool,
) -> tuple[BlockRank, ...]:
    """(dim, alpha, conv_dim, conv_alpha) of each of the ``num_blocks(sdxl)`` blocks.

    Each list given must have exactly one value per block. Unset ``block_dims`` /
    ``block_alphas``: ``dim`` / ``alpha`` everywhere. ``conv_block_dims`` enables conv LoRA per
    block (0 leaves a block's 3x3 convs alone), with ``conv_block_alphas`` or else
    ``conv_alpha`` (default 1) everywhere; unset, ``conv_dim`` / ``conv_alpha`` apply to every
    block when ``conv_dim`` is set, and there is no conv LoRA otherwise. A block whose dim is 0
    gets no Linear/1x1 modules. Raises ValueError naming the key, the count and the fix, and for
    ``conv_block_alphas`` without ``conv_block_dims`` (kohya ignores it then).
    """
    n = num_blocks(sdxl)
    count = f"give {n} values, one per {_family(sdxl)} block: {_all_blocks(sdxl)}"
    dims = [dim] * n if block_dims is None else _ranks("block_dims", block_dims, n, count)
    alphas = [float(alpha)] * n
    if block_alphas is not None:
        alphas, _ = _numbers("block_alphas", block_alphas, count)
        _check_count("block_alphas", alphas, n, count)
    conv_alpha = 1.0 if conv_alpha is None else float(conv_alpha)
    conv_dims: list[int | None] = [None] * n
    conv_alphas: list[float | None] = [None] * n
    if conv_block_dims is not None:
        conv_dims = list(_ranks("conv_block_dims", conv_block_dims, n, count))
        conv_alphas = [conv_alpha] * n
        if conv_block_alphas is not None:
            given, _ = _numbers("conv_block_alphas", conv_block_alphas, count)
            _check_count("conv_block_alphas", given, n, count)
            conv_alphas = list(given)
    elif conv_block_alphas is not None:
        raise ValueError(
            f"conv_block_alphas is only read together with conv_block_dims (kohya ignores it "
            f"otherwise); add conv_block_dims ({n} conv ranks) or remove conv_block_alphas"
        )
    elif conv_dim is not None:
        conv_dims, conv_alphas = [conv_dim] * n, [conv_alpha] * n
    for key, ranks, scales in (
        ("block_alphas", dims, alphas),
        ("conv_block_alphas", conv_dims, conv_alphas),
    ):
        for i, (rank, scale) in enumerate(zip(ranks, scales, strict=True)):
            if rank and scale <= 0:
                raise ValueError(
                    f"{key} value {i} (block {i}) is {_show(scale)} but the block has rank {rank}; alphas "
                    "must be > 0 (or set the block's rank to 0 to leave it out)"
                )
    return tuple(
        BlockRank(d, a, c, ca)
        for d, a, c, ca in zip(dims, alphas, conv_dims, conv_alphas, strict=True)
    )


# --- the whole setting ------------------------------------------------------------------------


@dataclass(frozen=True)
class BlockwiseSpec:
    """The block-wise setting of one networks.lora network, queried by kohya module name.

    ``ranks`` already holds kohya's removal of zero-weight blocks (their dim and conv_dim are 0);
    ``lr_weights`` is None when no lr weight was given (one UNet learning rate). ``dim`` /
    ``alpha`` are network_dim / network_alpha, which text-encoder modules keep.
    """

    sdxl: bool
    ranks: tuple[BlockRank, ...]
    lr_weights: tuple[float, ...] | None
    dim: int
    alpha: float

    def __post_init__(self) -> None:
        n = num_blocks(self.sdxl)
        if len(self.ranks) != n or (self.lr_weights is not None and len(self.lr_weights) != n):
            raise ValueError(
                f"{_family(self.sdxl)} block-wise settings have {n} blocks, got "
                f"{len(self.ranks)} ranks and "
                f"{'no' if self.lr_weights is None else len(self.lr_weights)} lr weights"
            )

    @property
    def conv(self) -> bool:
        """Whether ResNet blocks and samplers are targets (kohya: conv_dim or conv_block_dims
        set). Their Linear and 1x1 layers then take the block's linear rank even in blocks whose
        conv rank is 0."""
        return self.ranks[0].conv_dim is not None

    def block(self, name: str) -> int | None:
        """The block of a module (None for a text-encoder module); ValueError for a UNet module
        outside kohya's numbered blocks or a name that is neither."""
        if name.startswith("lora_te"):
            return None
        index = block_index(name, self.sdxl) if name.startswith("lora_unet_") else None
        if index is None:
            raise ValueError(
                f"{name} is not in a block of kohya's {_family(self.sdxl)} numbering "
                f"({_all_blocks(self.sdxl)}), so block-wise network_args cannot place it"
            )
        return index

    def rank_alpha(self, name: str, kind: Kind) -> tuple[int, float] | None:
        """(rank, alpha) of the module ``name`` of ``kind`` ("linear": Linear and 1x1 conv,
        "conv": 3x3 conv), or None when it gets no LoRA (rank 0, a zero-weight block, or conv
        LoRA off)."""
        if kind not in ("linear", "conv"):
            raise ValueError(f"unknown module kind {kind!r}; expected 'linear' or 'conv'")
        index = self.block(name)
        if index is None:
            if kind == "conv":
                raise ValueError(f"{name}: a text-encoder module has no conv LoRA")
            return self.dim, float(self.alpha)
        rank = self.ranks[index]
        dim, alpha = (
            (rank.dim, rank.alpha) if kind == "linear" else (rank.conv_dim, rank.conv_alpha)
        )
        if not dim:
            return None
        return dim, float(alpha)

    def dropped(self, name: str, kind: Kind) -> bool:
        """Whether the module gets no LoRA (see ``rank_alpha``)."""
        return self.rank_alpha(name, kind) is None

    def lr_weight(self, name: str) -> float:
        """The multiplier of the UNet learning rate for the module's block; 1 for text-encoder
        modules (they train at the text-encoder rate) and when no lr weight is set."""
        index = self.block(name)
        if index is None or self.lr_weights is None:
            return 1.0
        return self.lr_weights[index]


def blockwise_spec(
    args: Mapping[str, object],
    *,
    dim: int,
    alpha: float,
    conv_dim: int | None = None,
    conv_alpha: float | None = None,
    sdxl: bool,
) -> BlockwiseSpec | None:
    """The block-wise setting of ``network_args`` (as parsed; other keys are ignored), or None
    when it has none.

    As in kohya, the setting is on when ``block_dims`` or an lr weight is given; the other rank
    keys alone are refused (kohya would ignore them), ``block_lr_zero_threshold`` alone only
    draws a warning (it changes nothing). Blocks whose lr weight is 0 lose their modules.
    """
    weights = lr_weights(
        args.get("down_lr_weight"),
        args.get("mid_lr_weight"),
        args.get("up_lr_weight"),
        args.get("block_lr_zero_threshold"),
        sdxl=sdxl,
    )
    if weights is None and args.get("block_dims") is None:
        for key in ("block_alphas", "conv_block_dims", "conv_block_alphas"):
            if args.get(key) is not None:
                raise ValueError(
                    f"{key} is only read together with block_dims or down_lr_weight / "
                    f"mid_lr_weight / up_lr_weight (kohya ignores it otherwise); add block_dims "
                    f"({num_blocks(sdxl)} ranks) or remove {key}"
                )
        if args.get("block_lr_zero_threshold") is not None:
            log.warning(
                "block_lr_zero_threshold has no effect without down_lr_weight, mid_lr_weight "
                "or up_lr_weight"
            )
        return None
    ranks = block_ranks(
        args.get("block_dims"),
        args.get("block_alphas"),
        args.get("conv_block_dims"),
        args.get("conv_block_alphas"),
        dim,
        alpha,
        conv_dim,
        conv_alpha,
        sdxl=sdxl,
    )
    if weights is not None:
        ranks = tuple(
            r._replace(dim=0, conv_dim=None if r.conv_dim is None else 0) if w == 0 else r
            for r, w in zip(ranks, weights, strict=True)
        )
    return BlockwiseSpec(
        sdxl=sdxl,
        ranks=ranks,
        lr_weights=None if weights is None else tuple(weights),
        dim=dim,
        alpha=float(alpha),
    )
