"""Low-rank algebra shared by the commands that write LoRA factors (resize, merge-loras, ...).

A module's weight change is handled as a matrix: Linear [out, in] as it is, a kh x kw
convolution flattened to [out, in*kh*kw] (LoCon's layout: the kernel lives in lora_down and
lora_up is 1x1), so one SVD serves both and the factors are reshaped back to
down [r, in, kh, kw] / up [out, r, 1, 1].

The helpers here: reading a file's kohya modules as factor pairs (``lora_modules``), the SVD of a
change given as factors (exact and cheap: two QR decompositions and the SVD of an r x r matrix)
or as a dense matrix, choosing the rank to keep (fixed, or sd-scripts' dynamic rules
sv_ratio / sv_fro / sv_cumulative), and splitting the kept singular values between up and down.
Sums are done in float64; results are float32 until written.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import torch

from library.errors import CheckpointError, ConfigError
from library.lora_tools.common import ALPHA, DOWN, KOHYA_LORA, UP, module_algorithm, module_groups

RANK_METHODS = ("sv_ratio", "sv_fro", "sv_cumulative")
_WHY_NOT = {
    "DoRA": (
        "its weight change depends on the base model's weights (DoRA rescales each column of "
        "W + delta by dora_scale), which this tool does not have, so it cannot be computed here"
    ),
}


@dataclass
class LoraModule:
    """One kohya module: the factors as stored and the alpha (rank when the file has none)."""

    name: str
    down: torch.Tensor  # [r, in] or [r, in, kh, kw]
    up: torch.Tensor  # [out, r] or [out, r, 1, 1]
    alpha: float

    @property
    def rank(self) -> int:
        return int(self.down.shape[0])

    @property
    def scale(self) -> float:
        return self.alpha / self.rank

    @property
    def kernel(self) -> tuple[int, ...]:
        """(kh, kw) of a conv module, () for a Linear one."""
        return tuple(self.down.shape[2:])

    @property
    def spatial(self) -> bool:
        """A kh x kw convolution with a kernel larger than 1x1 (what --conv_rank applies to)."""
        return self.down.ndim == 4 and self.kernel != (1, 1)

    @property
    def signature(self) -> tuple[int, int, int, int]:
        """(out, in, kh, kw) of the adapted weight; a Linear or 2-d 1x1 module is (out, in, 1, 1)."""
        kh, kw = self.kernel or (1, 1)
        return (int(self.up.shape[0]), int(self.down.shape[1]), kh, kw)

    def matrices(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(up [out, r], down [r, in*kh*kw]) in float64, unscaled."""
        up = self.up.reshape(self.up.shape[0], -1).double()
        return up, self.down.reshape(self.rank, -1).double()

    def delta(self) -> torch.Tensor:
        """``alpha / r * up @ down`` as a float64 [out, in*kh*kw] matrix."""
        up, down = self.matrices()
        return self.scale * (up @ down)


def lora_modules(tensors: Mapping[str, torch.Tensor], path: str | Path, what: str) -> dict:
    """name -> LoraModule of every module of a kohya LoRA/LoCon file.

    CheckpointError naming the file and module for anything else: LyCORIS modules (``what``,
    e.g. "resize", says which command refuses them and why it must), DoRA, a module without its
    down or up tensor, unknown tensors, or factors whose shapes do not fit together.
    """
    modules = {}
    for name, parts in sorted(module_groups(tensors).items()):
        algorithm = module_algorithm(parts)
        if algorithm not in KOHYA_LORA:
            raise CheckpointError(_refusal(path, name, algorithm, parts, what))
        unknown = sorted(set(parts) - {DOWN, UP, ALPHA})
        if unknown:
            raise CheckpointError(
                f"{path}: module {name} has a tensor a kohya LoRA does not ({name}.{unknown[0]})"
            )
        if UP not in parts:
            raise CheckpointError(f"{path}: module {name} has no {UP}")
        down, up = parts[DOWN], parts[UP]
        fits = (
            down.ndim in (2, 4)
            and up.ndim in (2, 4)
            and up.shape[1] == down.shape[0]
            and tuple(up.shape[2:]) in ((), (1, 1))
        )
        if not fits or not (down.is_floating_point() and up.is_floating_point()):
            raise CheckpointError(
                f"{path}: module {name}: lora_up {list(up.shape)} does not fit lora_down "
                f"{list(down.shape)} (expected [out, r] or [out, r, 1, 1] with r = "
                f"{down.shape[0] if down.ndim else '?'})"
            )
        if ALPHA in parts and parts[ALPHA].numel() != 1:
            raise CheckpointError(f"{path}: module {name} has an alpha that is not one number")
        alpha = float(parts[ALPHA].float().item()) if ALPHA in parts else float(down.shape[0])
        if not math.isfinite(alpha):
            raise CheckpointError(f"{path}: module {name} has alpha {alpha}")
        modules[name] = LoraModule(name, down, up, alpha)
    if not modules:
        raise CheckpointError(f"{path}: has no LoRA modules (no lora_down/lora_up tensors)")
    return modules


def _refusal(path, name: str, algorithm: str, parts, what: str) -> str:
    if algorithm == "unknown" and set(parts) <= {UP, ALPHA}:
        return f"{path}: module {name} has no {DOWN}"
    if algorithm == "unknown":
        key = sorted(set(parts) - {UP, ALPHA})[0]
        return (
            f"{path}: {name}.{key} is not a kohya LoRA tensor; {what} reads only LoRA/LoCon files"
        )
    if "DoRA" in algorithm:
        return f"{path}: module {name} is {algorithm}: {what} refuses it, as {_WHY_NOT['DoRA']}"
    reason = {
        "resize": "its weights are not one pair of low-rank factors, so there is no rank to truncate",
        "merge-loras": "its weight change is not one pair of low-rank factors to stack or sum",
    }.get(what, "only LoRA/LoCon files (lora_down/lora_up) are read")
    return f"{path}: module {name} is LyCORIS {algorithm}; {what} refuses it, as {reason}"


@dataclass
class SVD:
    """A thin SVD ``U @ diag(S) @ Vh`` (float64), S descending."""

    U: torch.Tensor  # [out, k]
    S: torch.Tensor  # [k]
    Vh: torch.Tensor  # [k, n]


def svd_of_factors(up: torch.Tensor, down: torch.Tensor, device: torch.device | None = None) -> SVD:
    """The exact SVD of ``up @ down`` (up [out, r], down [r, n]) without forming it.

    With up = Qu Ru and down^T = Qd Rd, up @ down = Qu (Ru Rd^T) Qd^T, so the SVD of the small
    Ru Rd^T gives the singular values and, through Qu and Qd, the vectors. Only the at most
    min(out, r, n) singular values that can be non-zero are returned.
    """
    device = device or up.device
    up, down = up.to(device, torch.float64), down.to(device, torch.float64)
    q_up, r_up = torch.linalg.qr(up)  # [out, a], [a, r]
    q_down, r_down = torch.linalg.qr(down.T)  # [n, b], [b, r]
    u_small, s, vh_small = torch.linalg.svd(r_up @ r_down.T, full_matrices=False)
    return SVD(q_up @ u_small, s, vh_small @ q_down.T)


def svd_of_matrix(matrix: torch.Tensor, device: torch.device | None = None) -> SVD:
    """The thin SVD of a dense [out, n] weight change (e.g. a fine-tuned minus a base weight).

    LAPACK's divide and conquer costs about twice as much on a wide matrix as on its transpose
    (bench/svd_orientation.py), so a wide one (out < n) is decomposed as its transpose:
    ``M^T = U' S V'^T`` is ``M = V' S U'^T``, the same factors (each singular pair up to sign)."""
    device = device or matrix.device
    matrix = matrix.to(device, torch.float64)
    if matrix.shape[0] < matrix.shape[1]:
        u, s, vh = torch.linalg.svd(matrix.T, full_matrices=False)
        return SVD(vh.T, s, u.T)
    u, s, vh = torch.linalg.svd(matrix, full_matrices=False)
    return SVD(u, s, vh)


def check_dynamic(method: str | None, param: float | None) -> None:
    """ConfigError unless --dynamic_method and --dynamic_param come together with a usable value."""
    if method is None:
        if param is not None:
            raise ConfigError(
                "--dynamic_param needs --dynamic_method (sv_ratio, sv_fro or sv_cumulative)"
            )
        return
    if method not in RANK_METHODS:
        raise ConfigError(f"--dynamic_method {method}: choose one of {', '.join(RANK_METHODS)}")
    if param is None or not math.isfinite(param):
        raise ConfigError(f"--dynamic_method {method} needs a number in --dynamic_param")
    if method == "sv_ratio" and param < 1:
        raise ConfigError(
            f"--dynamic_param {param}: sv_ratio is the largest singular value divided by the "
            "smallest one kept, so it must be at least 1"
        )
    if method != "sv_ratio" and not 0 < param <= 1:
        raise ConfigError(
            f"--dynamic_param {param}: {method} is the fraction of the module to keep, "
            "greater than 0 and at most 1"
        )


def choose_rank(
    S: torch.Tensor, max_rank: int | None, method: str | None = None, param: float | None = None
) -> int:
    """How many singular values to keep, at least 1 and at most ``max_rank`` and len(S).

    Without ``method``: ``max_rank``. The dynamic rules keep the fewest values such that
    - sv_ratio: every kept value is > S[0] / param (the largest is at most ``param`` times the
      smallest kept);
    - sv_fro: sqrt(sum of kept S^2 / sum of all S^2) >= param (fraction of the Frobenius norm);
    - sv_cumulative: sum of kept S / sum of all S >= param.
    A zero change keeps rank 1. (sd-scripts' resize_lora.py, as of early 2026, keeps one value
    more than these rules and at least 2; see its pull request #2194.)
    """
    count = int(S.numel())
    if count == 0 or float(S[0]) == 0.0:
        return 1
    S = S.double()
    if method is None:
        rank = count
    elif method == "sv_ratio":
        smallest = S[0] / param
        rank = int(torch.gt(S, smallest).sum())
    else:
        values = S.square() if method == "sv_fro" else S
        target = param * param if method == "sv_fro" else param
        fraction = torch.cumsum(values, 0) / values.sum()
        # fewest k with fraction[k-1] >= target (rounding may leave the full sum just under 1)
        rank = int((fraction < target - 1e-12).sum()) + 1
    if max_rank is not None:
        rank = min(rank, max_rank)
    return max(1, min(rank, count))


def retained(S: torch.Tensor, rank: int) -> float:
    """The fraction of the change's Frobenius norm that the first ``rank`` values keep:
    sqrt(sum S[:rank]^2 / sum S^2) (1.0 for a zero change). sd-scripts' "fro retained"."""
    total = float(S.double().square().sum())
    if total == 0.0:
        return 1.0
    return math.sqrt(float(S[:rank].double().square().sum()) / total)


def split(svd: SVD, rank: int, factor: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """(up [out, rank], down [rank, n]) in float32 with ``up @ down = factor * U_k S_k Vh_k``.

    Each side gets sqrt(S) (and sqrt(|factor|), the sign going to up), so up and down have the
    same scale: nothing overflows in fp16 that need not, and the file trains on evenly.
    """
    root = svd.S[:rank].sqrt() * math.sqrt(abs(factor))
    up = svd.U[:, :rank] * root * (1.0 if factor >= 0 else -1.0)
    down = root[:, None] * svd.Vh[:rank]
    return up.float().cpu(), down.float().cpu()


def module_shapes(
    up: torch.Tensor, down: torch.Tensor, like: LoraModule
) -> tuple[torch.Tensor, torch.Tensor]:
    """(up, down) reshaped to the stored layout of ``like``: 2-d for a Linear (or a 1x1 stored as
    2-d), [out, r, 1, 1] / [r, in, kh, kw] for a conv."""
    rank = down.shape[0]
    if like.down.ndim == 4:
        return (
            up.reshape(up.shape[0], rank, 1, 1),
            down.reshape(rank, like.down.shape[1], *like.kernel),
        )
    return up, down


def format_alpha(alpha: float) -> str:
    """An alpha as metadata writes it: ``8.0``, ``0.1`` (float32 digits, no float noise)."""
    return str(float(f"{alpha:.7g}"))


def rank_metadata(
    ranks: Mapping[str, tuple[int, float, bool]],
    network_args: str | None,
    dynamic: bool = False,
) -> dict[str, str]:
    """ss_network_dim / ss_network_alpha / ss_network_args for modules ``name -> (rank, alpha,
    spatial)``: the rank and alpha of the Linear/1x1 modules when they all share one, else
    "Dynamic" (always with ``dynamic``, as sd-scripts writes); the args (JSON of the input, if
    any) get conv_dim / conv_alpha the same way when there are kh x kw conv modules."""

    def one(values: set, fmt) -> str:
        return fmt(next(iter(values))) if len(values) == 1 and not dynamic else "Dynamic"

    linear = [(r, a) for r, a, spatial in ranks.values() if not spatial]
    conv = [(r, a) for r, a, spatial in ranks.values() if spatial]
    keys = {}
    if linear:
        keys["ss_network_dim"] = one({r for r, _ in linear}, str)
        keys["ss_network_alpha"] = one({format_alpha(a) for _, a in linear}, str)
    try:
        args = json.loads(network_args) if network_args else {}
    except ValueError:
        args = None
    if isinstance(args, dict):
        if conv:
            args["conv_dim"] = one({r for r, _ in conv}, str)
            args["conv_alpha"] = one({format_alpha(a) for _, a in conv}, str)
        keys["ss_network_args"] = json.dumps(args)
    return keys
