"""The weight change one LyCORIS module's file tensors stand for, as pure tensor functions.

A LyCORIS (or kohya LoRA) file stores each adapted layer as a few tensors under one module name,
``<name>.<suffix>``. This module takes the ``{suffix: tensor}`` mapping of ONE such module and
computes what a reader (kohya, ComfyUI, LyCORIS' own loader) adds to the layer's weight. Tools that
bake a file into a model use :func:`merged_weight`; :class:`~library.networks.lycoris.layer.
LycorisLayer` reuses the ``rebuild_*`` and :func:`weight_decompose` functions for its own forward.

What a file means, per algorithm (``W`` is the layer's weight, shape ``(out, in, *kernel)``):

* LoCon / LoRA: ``ΔW = up @ down`` (``up`` [out, r], ``down`` [r, in·kernel]); with a Tucker
  ``lora_mid`` [r, r, *kernel] the 1x1 ``down`` and ``up`` wrap the mid kernel instead.
* LoHa: ``ΔW = (w1_a @ w1_b) ⊙ (w2_a @ w2_b)``; in the Tucker form each half is
  ``t ×₁ w_a ×₂ w_b`` with ``t`` [r, r, *kernel], ``w_a`` [r, out], ``w_b`` [r, in].
* LoKr: ``ΔW = w1 ⊗ w2`` with ``w1`` [a, c] (or ``w1_a @ w1_b``) and ``w2`` [b, d, *kernel]
  (or ``w2_a @ w2_b`` reshaped, or the Tucker ``t2 ×₁ w2_a ×₂ w2_b``); ``a·b = out``,
  ``c·d = in``.

The scale is ``alpha / rank`` (rank: the first dimension of ``lora_down``/``hada_w1_b``, or of the
factorised LoKr half's ``*_b``); a missing or zero alpha means scale 1. A LoKr module with neither
half factorised has no rank and always scale 1, whatever alpha the file holds (LyCORIS forces it).

DoRA (``dora_scale`` present): the merged weight is ``V · (m·(g/‖V‖ − 1) + 1)`` with
``V = W + ΔW`` (ΔW at multiplier 1), ``g`` the stored magnitudes, ``m`` the multiplier and the norm
taken per output row when ``dora_scale`` is ``[out, 1, …]`` and per input column when it is
``[1, in, …]``; at ``m = 1`` this is ``g · V / ‖V‖``. This is LyCORIS' formula for every ``m``;
ComfyUI uses ``W + m·(g·V/‖V‖ − W)``, which agrees at ``m = 1`` only.

Errors are ``ValueError`` naming the offending suffix; callers that load files wrap them in
``library.errors.CheckpointError`` with the file's name.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

LOCON_KEYS = ("lora_down.weight", "lora_mid.weight", "lora_up.weight")
LOHA_KEYS = ("hada_w1_a", "hada_w1_b", "hada_w2_a", "hada_w2_b", "hada_t1", "hada_t2")
LOKR_KEYS = ("lokr_w1", "lokr_w1_a", "lokr_w1_b", "lokr_w2", "lokr_w2_a", "lokr_w2_b", "lokr_t2")
SHARED_KEYS = ("alpha", "dora_scale")
ALGO_KEYS: dict[str, tuple[str, ...]] = {"locon": LOCON_KEYS, "loha": LOHA_KEYS, "lokr": LOKR_KEYS}
ALGO_LABELS = {"locon": "LoCon/LoRA", "loha": "LoHa", "lokr": "LoKr"}

# Suffixes of LyCORIS modules difftune does not read, with the algorithm that writes them.
_FOREIGN = {
    "lokr_t1": "LoKr with a Tucker w1 (not written by LyCORIS' trainer)",
    "on_input": "IA3",
    "weight": "IA3",
    "diff": "full fine-tuning (algo=full)",
    "diff_b": "full fine-tuning (algo=full)",
    "oft_blocks": "OFT/BOFT",
    "oft_diag": "OFT",
    "rescale": "OFT/BOFT",
    "w_norm": "norm fine-tuning (train_norm)",
    "b_norm": "norm fine-tuning (train_norm)",
    "a1.weight": "GLoRA",
    "a2.weight": "GLoRA",
    "b1.weight": "GLoRA",
    "b2.weight": "GLoRA",
    "scalar": "a module saved with an unfolded use_scalar scalar",
}


def module_algo(parts: Mapping[str, torch.Tensor]) -> str:
    """ "locon", "loha" or "lokr": the algorithm whose suffixes ``parts`` holds.

    A suffix no reader of those three understands, or a mix of two algorithms, is a ValueError
    naming the suffix.
    """
    known = {k for keys in ALGO_KEYS.values() for k in keys} | set(SHARED_KEYS)
    for key in sorted(parts):
        if key not in known:
            what = _FOREIGN.get(key)
            hint = f" (a {what} tensor)" if what else ""
            raise ValueError(
                f"unknown LyCORIS suffix {key!r}{hint}; difftune reads LoRA/LoCon "
                "(lora_down/lora_up), LoHa (hada_*) and LoKr (lokr_*) modules"
            )
    found = {algo: [k for k in keys if k in parts] for algo, keys in ALGO_KEYS.items()}
    present = [algo for algo, keys in found.items() if keys]
    if not present:
        raise ValueError(
            f"no weight tensors among suffixes {sorted(parts)}: a module needs lora_down/lora_up, "
            "hada_* or lokr_* tensors"
        )
    if len(present) > 1:
        first, second = present[:2]
        raise ValueError(
            f"suffixes mix a {ALGO_LABELS[first]} module ({found[first][0]}) and a "
            f"{ALGO_LABELS[second]} module ({found[second][0]})"
        )
    return present[0]


def _tail_squeezed(shape: Sequence[int]) -> tuple[int, ...]:
    """The shape without trailing size-1 axes past the second (1x1 kernels), for comparisons."""
    dims = list(shape)
    while len(dims) > 2 and dims[-1] == 1:
        dims.pop()
    return tuple(dims)


def _expect(parts: Mapping[str, torch.Tensor], key: str, expected: Sequence[int], weight_shape):
    """ValueError unless parts[key] has ``expected`` shape (a 1x1 kernel may be left off)."""
    got = tuple(parts[key].shape)
    if got != tuple(expected) and _tail_squeezed(got) != _tail_squeezed(expected):
        raise ValueError(
            f"{key} has shape {list(got)}, expected {list(expected)} for a layer weight of "
            f"shape {list(weight_shape)}"
        )


def _require(parts: Mapping[str, torch.Tensor], algo: str, *keys: str) -> None:
    for key in keys:
        if key not in parts:
            raise ValueError(f"{ALGO_LABELS[algo]} module lacks its {key} tensor")


def _one_of(parts: Mapping[str, torch.Tensor], full: str, pair: tuple[str, str]) -> bool:
    """True when the full matrix ``full`` is stored, False for the ``pair`` factors."""
    has_full = full in parts
    has_pair = [k in parts for k in pair]
    if has_full and any(has_pair):
        extra = pair[has_pair.index(True)]
        raise ValueError(f"LoKr module holds both {full} and {extra}; a half is one or the other")
    if not has_full and not all(has_pair):
        missing = pair[has_pair.index(False)] if any(has_pair) else f"{full} or {pair[0]}"
        raise ValueError(f"LoKr module lacks its {missing} tensor")
    return has_full


def module_rank(parts: Mapping[str, torch.Tensor]) -> int | None:
    """The rank alpha divides by; None for a LoKr module with no factorised half (scale 1)."""
    algo = module_algo(parts)
    if algo == "locon":
        return int(parts["lora_down.weight"].shape[0])
    if algo == "loha":
        return int(parts["hada_w1_b"].shape[0])
    if "lokr_w1_b" in parts:
        return int(parts["lokr_w1_b"].shape[0])
    if "lokr_w2_b" in parts:
        return int(parts["lokr_w2_b"].shape[0])
    return None


def module_scale(parts: Mapping[str, torch.Tensor]) -> float:
    """``alpha / rank`` of the module (1 without alpha, with alpha 0, or for full LoKr halves)."""
    rank = module_rank(parts)
    if rank is None or "alpha" not in parts:
        return 1.0
    alpha = parts["alpha"]
    if alpha.numel() != 1:
        raise ValueError(f"alpha must hold one number, got shape {list(alpha.shape)}")
    value = float(alpha.float().item())
    if value != value or value in (float("inf"), float("-inf")):
        raise ValueError(f"alpha is {value}, not a finite number")
    return 1.0 if value == 0 else value / rank


def check_shapes(parts: Mapping[str, torch.Tensor], weight_shape: Sequence[int]) -> str:
    """Check every tensor of ``parts`` fits a layer weight of ``weight_shape``; return the algo.

    The first mismatch is a ValueError naming its suffix and both shapes.
    """
    algo = module_algo(parts)
    shape = tuple(int(s) for s in weight_shape)
    if len(shape) < 2:
        raise ValueError(f"layer weight of shape {list(shape)} is neither a Linear nor a conv")
    out_dim, in_dim, kernel = shape[0], shape[1], shape[2:]
    ones = (1,) * len(kernel)
    k_numel = 1
    for k in kernel:
        k_numel *= k
    if algo == "locon":
        _require(parts, algo, "lora_down.weight", "lora_up.weight")
        rank = parts["lora_down.weight"].shape[0]
        if "lora_mid.weight" in parts:
            if not kernel:
                raise ValueError("lora_mid.weight (a Tucker LoCon) cannot adapt a Linear layer")
            _expect(parts, "lora_down.weight", (rank, in_dim, *ones), shape)
            _expect(parts, "lora_mid.weight", (rank, rank, *kernel), shape)
        else:
            _expect(parts, "lora_down.weight", (rank, in_dim, *kernel), shape)
        _expect(parts, "lora_up.weight", (out_dim, rank, *ones), shape)
    elif algo == "loha":
        _require(parts, algo, "hada_w1_a", "hada_w1_b", "hada_w2_a", "hada_w2_b")
        tucker = [k in parts for k in ("hada_t1", "hada_t2")]
        if any(tucker) and not all(tucker):
            raise ValueError(
                f"LoHa module holds {'hada_t1' if tucker[0] else 'hada_t2'} without "
                f"{'hada_t2' if tucker[0] else 'hada_t1'}; a Tucker LoHa needs both"
            )
        for half in ("1", "2"):
            rank = parts[f"hada_w{half}_b"].shape[0]
            if all(tucker):
                if not kernel:
                    raise ValueError(f"hada_t{half} (a Tucker LoHa) cannot adapt a Linear layer")
                _expect(parts, f"hada_t{half}", (rank, rank, *kernel), shape)
                _expect(parts, f"hada_w{half}_a", (rank, out_dim), shape)
                _expect(parts, f"hada_w{half}_b", (rank, in_dim), shape)
            else:
                _expect(parts, f"hada_w{half}_a", (out_dim, rank), shape)
                _expect(parts, f"hada_w{half}_b", (rank, in_dim * k_numel), shape)
    else:
        full1 = _one_of(parts, "lokr_w1", ("lokr_w1_a", "lokr_w1_b"))
        full2 = _one_of(parts, "lokr_w2", ("lokr_w2_a", "lokr_w2_b"))
        if full1:
            w1 = parts["lokr_w1"]
            if w1.dim() != 2:
                raise ValueError(f"lokr_w1 has shape {list(w1.shape)}, expected a matrix")
            a, c = w1.shape
        else:
            r1 = parts["lokr_w1_a"].shape[-1]
            a, c = parts["lokr_w1_a"].shape[0], parts["lokr_w1_b"].shape[-1]
            _expect(parts, "lokr_w1_a", (a, r1), shape)
            _expect(parts, "lokr_w1_b", (r1, c), shape)
        if a == 0 or c == 0 or out_dim % a or in_dim % c:
            key = "lokr_w1" if full1 else "lokr_w1_a"
            raise ValueError(
                f"{key} makes a [{a}, {c}] first Kronecker factor, which does not divide a layer "
                f"weight of shape {list(shape)}"
            )
        b, d = out_dim // a, in_dim // c
        if "lokr_t2" in parts:
            if full2:
                raise ValueError(
                    "LoKr module holds lokr_t2 with a full lokr_w2; t2 needs w2_a/w2_b"
                )
            if not kernel:
                raise ValueError("lokr_t2 (a Tucker LoKr) cannot adapt a Linear layer")
            rank = parts["lokr_t2"].shape[0]
            _expect(parts, "lokr_t2", (rank, rank, *kernel), shape)
            _expect(parts, "lokr_w2_a", (rank, b), shape)
            _expect(parts, "lokr_w2_b", (rank, d), shape)
        elif full2:
            _expect(parts, "lokr_w2", (b, d, *kernel), shape)
        else:
            rank = parts["lokr_w2_b"].shape[0]
            _expect(parts, "lokr_w2_a", (b, rank), shape)
            _expect(parts, "lokr_w2_b", (rank, d * k_numel), shape)
        if not full1 and not full2 and parts["lokr_w1_b"].shape[0] != parts["lokr_w2_b"].shape[0]:
            raise ValueError(
                f"lokr_w1_b has rank {parts['lokr_w1_b'].shape[0]} but lokr_w2_b has rank "
                f"{parts['lokr_w2_b'].shape[0]}; both halves share one rank"
            )
    if "dora_scale" in parts:
        dora_on_output(parts["dora_scale"], shape)
    return algo


def dora_on_output(dora_scale: torch.Tensor, weight_shape: Sequence[int]) -> bool:
    """True when ``dora_scale`` holds per-output-row magnitudes ``[out, 1, …]`` (LyCORIS'
    ``wd_on_output=True``), False for per-input-column ones ``[1, in, …]``.

    Decided from the shape as ComfyUI does; a square 1x1 case reads as per-output.
    """
    shape = tuple(int(s) for s in weight_shape)
    ones = (1,) * (len(shape) - 2)
    got = tuple(dora_scale.shape)
    on_out = (shape[0], 1, *ones)
    on_in = (1, shape[1], *ones)
    if got == on_out:
        return True
    if got == on_in:
        return False
    raise ValueError(
        f"dora_scale has shape {list(got)}, expected {list(on_out)} (wd_on_output=true) or "
        f"{list(on_in)} (wd_on_output=false) for a layer weight of shape {list(shape)}"
    )


def rebuild_locon(
    down: torch.Tensor,
    up: torch.Tensor,
    mid: torch.Tensor | None,
    weight_shape: Sequence[int],
) -> torch.Tensor:
    """Unscaled LoCon ΔW shaped ``weight_shape``: ``up ∘ down``, or ``up ∘ mid ∘ down``."""
    up2 = up.reshape(up.shape[0], -1)
    down2 = down.reshape(down.shape[0], -1)
    if mid is None:
        return (up2 @ down2).reshape(weight_shape)
    # mid maps the rank channels of down (j) onto those of up (i) with the layer's kernel.
    return torch.einsum("ij...,oi,jn->on...", mid, up2, down2).reshape(weight_shape)


def rebuild_loha(
    w1_a: torch.Tensor,
    w1_b: torch.Tensor,
    w2_a: torch.Tensor,
    w2_b: torch.Tensor,
    t1: torch.Tensor | None,
    t2: torch.Tensor | None,
    weight_shape: Sequence[int],
) -> torch.Tensor:
    """Unscaled LoHa ΔW shaped ``weight_shape``: the Hadamard product of two low-rank halves."""
    if t1 is None or t2 is None:
        first = w1_a @ w1_b.reshape(w1_b.shape[0], -1)
        second = w2_a @ w2_b.reshape(w2_b.shape[0], -1)
    else:
        first = torch.einsum("ij...,io,jn->on...", t1, w1_a, w1_b)
        second = torch.einsum("ij...,io,jn->on...", t2, w2_a, w2_b)
    return (first * second).reshape(weight_shape)


def rebuild_lokr(
    w1: torch.Tensor | None,
    w1_a: torch.Tensor | None,
    w1_b: torch.Tensor | None,
    w2: torch.Tensor | None,
    w2_a: torch.Tensor | None,
    w2_b: torch.Tensor | None,
    t2: torch.Tensor | None,
    weight_shape: Sequence[int],
) -> torch.Tensor:
    """Unscaled LoKr ΔW shaped ``weight_shape``: ``w1 ⊗ w2``, each half rebuilt first."""
    shape = tuple(int(s) for s in weight_shape)
    kernel = shape[2:]
    first = w1 if w1 is not None else w1_a @ w1_b
    a, c = first.shape
    b, d = shape[0] // a, shape[1] // c
    if w2 is not None:
        second = w2.reshape(b, d, *kernel)
    elif t2 is not None:
        second = torch.einsum("ij...,ip,jq->pq...", t2, w2_a, w2_b)
    else:
        second = (w2_a @ w2_b).reshape(b, d, *kernel)
    first = first.reshape(a, c, *(1,) * len(kernel))
    # torch.kron needs contiguous operands (an einsum result may not be).
    return torch.kron(first.contiguous(), second.contiguous()).reshape(shape)


def weight_decompose(
    combined: torch.Tensor, dora_scale: torch.Tensor, multiplier: float, on_output: bool
) -> torch.Tensor:
    """LyCORIS' DoRA step on ``combined = W + ΔW``: ``V · (m·(g/(‖V‖+eps) − 1) + 1)``.

    The norm is per output row (``on_output``) or per input column, and is NOT detached:
    gradients flow through it, as in LyCORIS' modules.
    """
    combined = combined.to(dora_scale.dtype)
    if on_output:
        norm = combined.reshape(combined.shape[0], -1).norm(dim=1)
        norm = norm.reshape(combined.shape[0], *(1,) * (combined.dim() - 1))
    else:
        norm = combined.transpose(0, 1).reshape(combined.shape[1], -1).norm(dim=1)
        norm = norm.reshape(1, combined.shape[1], *(1,) * (combined.dim() - 2))
    ratio = dora_scale / (norm + torch.finfo(combined.dtype).eps)
    if multiplier != 1:
        ratio = multiplier * (ratio - 1) + 1
    return combined * ratio


def _get(parts: Mapping[str, torch.Tensor], key: str) -> torch.Tensor | None:
    value = parts.get(key)
    return None if value is None else value.float()


def raw_delta(parts: Mapping[str, torch.Tensor], weight_shape: Sequence[int]) -> torch.Tensor:
    """ΔW of an already-checked module WITHOUT its alpha / rank scale (float32 math)."""
    algo = module_algo(parts)
    if algo == "locon":
        return rebuild_locon(
            _get(parts, "lora_down.weight"),
            _get(parts, "lora_up.weight"),
            _get(parts, "lora_mid.weight"),
            weight_shape,
        )
    if algo == "loha":
        return rebuild_loha(*(_get(parts, k) for k in LOHA_KEYS), weight_shape)
    return rebuild_lokr(*(_get(parts, k) for k in LOKR_KEYS), weight_shape)


def module_delta(parts: Mapping[str, torch.Tensor], weight_shape: Sequence[int]) -> torch.Tensor:
    """The float32 weight change ``scale · ΔW`` of one module, shaped ``weight_shape``.

    Reads LyCORIS LoCon/LoHa/LoKr modules and kohya's plain LoRA (``lora_down.weight``,
    ``lora_up.weight``, ``alpha``: LoCon without mid). The multiplier and DoRA are not applied
    (see :func:`merged_weight`). Wrong suffixes or shapes are a ValueError naming the suffix.
    """
    check_shapes(parts, weight_shape)
    with torch.no_grad():
        return raw_delta(parts, weight_shape) * module_scale(parts)


def merged_weight(
    weight: torch.Tensor, parts: Mapping[str, torch.Tensor], multiplier: float = 1.0
) -> torch.Tensor:
    """The float32 weight a layer computes with once the module is merged into ``weight``.

    ``weight + multiplier · ΔW``, or with ``dora_scale`` LyCORIS' DoRA of ``weight + ΔW`` with
    the multiplier applied to the magnitude change (see the module docstring).
    """
    delta = module_delta(parts, weight.shape).to(weight.device)
    with torch.no_grad():
        base = weight.detach().float()
        if "dora_scale" not in parts:
            return base + multiplier * delta
        dora_scale = parts["dora_scale"].detach().float().to(weight.device)
        on_output = dora_on_output(dora_scale, weight.shape)
        return weight_decompose(base + delta, dora_scale, multiplier, on_output)
