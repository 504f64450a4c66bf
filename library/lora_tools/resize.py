"""``resize``: give a LoRA/LoCon file a lower rank, keeping as much of each module as the rank
allows (sd-scripts' networks/resize_lora.py).

Each module's change ``alpha / r * up @ down`` is decomposed by SVD and its largest singular
values are kept: for a given rank that is the closest file there is (in the Frobenius norm,
module by module). The rank is --rank (--conv_rank for kh x kw convolutions), or chosen per
module by a --dynamic_method rule with --rank as the ceiling. A module's rank never grows.
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

import torch

from library.errors import ConfigError
from library.lora_tools import svd
from library.lora_tools.common import (
    ALPHA,
    DOWN,
    DTYPES,
    UP,
    add_output_arguments,
    checked_device,
    checked_output,
    human_size,
    input_dtype,
    read_lora,
    refuse_non_finite_result,
    write_file,
)
from library.networks.linear_files import PEFT_DOWN, fold_into_peft, unfold_peft

HELP = "lower the rank of a LoRA/LoCon file by SVD (fixed or dynamic per-module ranks)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--input", required=True, help="the LoRA/LoCon file to resize")
    parser.add_argument(
        "--rank",
        type=int,
        default=None,
        help="the new rank of Linear and 1x1 modules; with --dynamic_method the most a module "
        "may keep (default there: its own rank)",
    )
    parser.add_argument(
        "--conv_rank",
        type=int,
        default=None,
        help="the new rank (or ceiling) of kh x kw conv (LoCon) modules (default: --rank)",
    )
    parser.add_argument(
        "--dynamic_method",
        choices=svd.RANK_METHODS,
        default=None,
        help="choose each module's rank from its singular values: sv_ratio (keep values above "
        "the largest / PARAM), sv_fro (keep fraction PARAM of the Frobenius norm), "
        "sv_cumulative (keep fraction PARAM of the sum of singular values)",
    )
    parser.add_argument(
        "--dynamic_param", type=float, default=None, help="the number the dynamic rule uses"
    )
    parser.add_argument(
        "--new_alpha",
        type=float,
        default=None,
        help="write this alpha for every module, folding the difference into the weights "
        "(default: alpha * new_rank / old_rank, which keeps alpha / rank)",
    )
    parser.add_argument(
        "--device", default="cpu", help="where to run the SVDs: cpu (default), cuda, cuda:1, ..."
    )
    parser.add_argument(
        "--verbose", action="store_true", help="print each module's new rank and what it keeps"
    )
    add_output_arguments(parser, "resized LoRA file")


def _check_arguments(args: argparse.Namespace) -> None:
    svd.check_dynamic(args.dynamic_method, args.dynamic_param)
    if args.rank is None and args.dynamic_method is None:
        raise ConfigError("--rank is required (or give --dynamic_method to choose ranks)")
    for option, value in (("--rank", args.rank), ("--conv_rank", args.conv_rank)):
        if value is not None and value < 1:
            raise ConfigError(f"{option} {value}: a rank is at least 1")
    if args.new_alpha is not None and (args.new_alpha == 0 or not math.isfinite(args.new_alpha)):
        raise ConfigError(f"--new_alpha {args.new_alpha}: must be a finite, non-zero number")


def _comment(args, old_ranks: set[int], old_conv: set[int], previous: str | None) -> str:
    def ranks(values: set[int]) -> str:
        return "/".join(str(v) for v in sorted(values))

    if args.dynamic_method:
        ceiling = "" if args.rank is None else f", at most {args.rank}"
        note = (
            f"resized by lora_tool.py resize with {args.dynamic_method} {args.dynamic_param:g}"
            f"{ceiling} from rank {ranks(old_ranks | old_conv)}"
        )
    else:
        note = f"rank resized by lora_tool.py resize from {ranks(old_ranks) or '-'} to {args.rank}"
        if old_conv:
            note += f" (conv: {ranks(old_conv)} to {args.conv_rank or args.rank})"
    return f"{note}; {previous}" if previous and previous != "None" else note


def run(args: argparse.Namespace) -> int:
    _check_arguments(args)
    output = checked_output(args.output, args.overwrite, [("--input", args.input)])
    device = checked_device(args.device)
    tensors, metadata = read_lora(args.input, "--input")
    # peft's tensor names (lora_A / lora_B, scale 1: a family whose files fold alpha in) are
    # resized as kohya's with alpha = rank, and written back in them
    peft = any(key.endswith(PEFT_DOWN) for key in tensors)
    if peft:
        tensors = unfold_peft(tensors)
    modules = svd.lora_modules(tensors, args.input, "resize")
    dtype = DTYPES[args.save_precision] if args.save_precision else input_dtype(tensors)

    out: dict[str, torch.Tensor] = {}
    kept: dict[str, tuple[int, float, bool]] = {}
    fractions = []
    width = max(len(name) for name in modules)
    for name, module in modules.items():
        ceiling = (args.conv_rank or args.rank) if module.spatial else args.rank
        up, down = module.matrices()
        decomposition = svd.svd_of_factors(up, down, device)
        rank = svd.choose_rank(decomposition.S, ceiling, args.dynamic_method, args.dynamic_param)
        # the factors hold U S Vh of up @ down; alpha / rank must then be the old alpha / rank
        alpha = module.scale * rank if args.new_alpha is None else args.new_alpha
        factor = module.scale * rank / alpha if alpha else 1.0  # alpha 0: the change is zero
        new_up, new_down = svd.split(decomposition, rank, factor)
        new_up, new_down = svd.module_shapes(new_up, new_down, module)
        out[f"{name}.{DOWN}"] = new_down
        out[f"{name}.{UP}"] = new_up
        out[f"{name}.{ALPHA}"] = torch.tensor(alpha, dtype=torch.float32)
        kept[name] = (rank, alpha, module.spatial)
        fraction = svd.retained(decomposition.S, rank)
        fractions.append(fraction)
        if args.verbose:
            print(
                f"{name:{width}}  rank {module.rank:>4} -> {rank:<4} alpha "
                f"{svd.format_alpha(module.alpha)} -> {svd.format_alpha(alpha)}  "
                f"Frobenius norm kept {fraction:.2%}"
            )

    if args.new_alpha is not None:
        cause = f"--new_alpha {args.new_alpha:g}"
        refuse_non_finite_result(out, dtype, cause, "give another value")
    else:
        written = f"--save_precision {args.save_precision}" if args.save_precision else None
        refuse_non_finite_result(out, dtype, written or f"{args.input}'s dtype")
    if peft:
        out = fold_into_peft(out)
    metadata = {k: v for k, v in metadata.items() if k != "ss_session_id"}
    metadata.update(
        svd.rank_metadata(kept, metadata.get("ss_network_args"), bool(args.dynamic_method))
    )
    old_linear = {m.rank for m in modules.values() if not m.spatial}
    old_conv = {m.rank for m in modules.values() if m.spatial}
    metadata["ss_training_comment"] = _comment(
        args, old_linear, old_conv, metadata.get("ss_training_comment")
    )
    write_file(output, out, metadata, dtype)

    new_ranks = sorted({rank for rank, _, _ in kept.values()})
    shown = (
        "/".join(map(str, new_ranks)) if len(new_ranks) <= 4 else f"{new_ranks[0]}-{new_ranks[-1]}"
    )
    print(
        f"resized {len(modules)} modules of {args.input} to rank {shown}; Frobenius norm kept: "
        f"mean {sum(fractions) / len(fractions):.2%}, min {min(fractions):.2%}; "
        f"{human_size(Path(args.input).stat().st_size)} -> {human_size(output.stat().st_size)}; "
        f"wrote {output}"
    )
    return 0
