"""``merge-loras``: combine several LoRA/LoCon files into one (sd-scripts' networks/merge_lora.py
--concat and networks/svd_merge_lora.py).

The result's change of each module is ``sum(ratio_i * alpha_i / r_i * up_i @ down_i)`` over the
inputs that have the module. ``concat`` writes that sum exactly, stacking the inputs' ranks;
``svd`` computes it and keeps its best approximation of --rank.
"""

from __future__ import annotations

import argparse
import math
import time
from datetime import datetime
from pathlib import Path

import torch

from library.errors import CheckpointError, ConfigError
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
    ratios_for,
    read_lora,
    refuse_non_finite_result,
    write_file,
)

HELP = "merge LoRA/LoCon files into one: exactly (concat ranks) or by SVD to a given rank"

# Keys describing the base model and the file's kind, taken from the first input that has them.
_CARRIED = (
    "ss_v2",
    "ss_base_model_version",
    "ss_v_parameterization",
    "modelspec.sai_model_spec",
    "modelspec.architecture",
    "modelspec.implementation",
    "modelspec.prediction_type",
    "modelspec.resolution",
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--inputs", nargs="+", required=True, metavar="FILE", help="the LoRA/LoCon files to merge"
    )
    parser.add_argument(
        "--ratios",
        nargs="+",
        type=float,
        default=None,
        metavar="RATIO",
        help="the weight of each input's change, one per input, from -100 to 100 (default: 1 "
        "each; negative subtracts)",
    )
    parser.add_argument(
        "--method",
        choices=("concat", "svd"),
        default="concat",
        help="concat (default): stack the inputs' ranks, exact, rank = sum of the inputs' "
        "ranks; svd: the best approximation of the sum with --rank",
    )
    parser.add_argument(
        "--rank", type=int, default=None, help="svd: the rank of Linear and 1x1 modules"
    )
    parser.add_argument(
        "--conv_rank",
        type=int,
        default=None,
        help="svd: the rank of kh x kw conv (LoCon) modules (default: --rank)",
    )
    parser.add_argument(
        "--device", default="cpu", help="svd: where to run the SVDs: cpu (default), cuda, ..."
    )
    parser.add_argument(
        "--force",
        action="store_true",
        help="merge even when the inputs' metadata names different base models",
    )
    add_output_arguments(parser, "merged LoRA file")


def _ratios(args: argparse.Namespace) -> list[float]:
    ratios = ratios_for(args.ratios, len(args.inputs), "--inputs")
    if args.method == "svd" and args.rank is None:
        raise ConfigError("--method svd needs --rank")
    if args.method == "concat" and (args.rank is not None or args.conv_rank is not None):
        raise ConfigError("--rank and --conv_rank apply to --method svd; concat keeps all ranks")
    for option, value in (("--rank", args.rank), ("--conv_rank", args.conv_rank)):
        if value is not None and value < 1:
            raise ConfigError(f"{option} {value}: a rank is at least 1")
    return ratios


def _check_base_models(paths: list[str], metadatas: list[dict[str, str]], force: bool) -> None:
    seen: tuple[str, str] | None = None
    for path, metadata in zip(paths, metadatas, strict=True):
        version = metadata.get("ss_base_model_version")
        if not version or version == "None":
            continue
        if seen is None:
            seen = (path, version)
        elif version != seen[1] and not force:
            raise CheckpointError(
                f"{seen[0]} is for {seen[1]} but {path} is for {version} "
                "(ss_base_model_version); add --force to merge them anyway"
            )


def _shape(module: svd.LoraModule) -> str:
    out, inp, kh, kw = module.signature
    return f"[{out}, {inp}, {kh}, {kw}]" if module.down.ndim == 4 else f"[{out}, {inp}]"


def _stacked(parts: list[tuple[str, svd.LoraModule, float]]) -> tuple[torch.Tensor, torch.Tensor]:
    """(up [out, R], down [R, n]) in float64 with up @ down = sum(ratio * alpha / r * up @ down):
    each input's factor ratio * alpha / r is split as sqrt between its up and down."""
    ups, downs = [], []
    for _, module, ratio in parts:
        up, down = module.matrices()
        factor = ratio * module.scale
        root = math.sqrt(abs(factor))
        ups.append(up * (root if factor >= 0 else -root))
        downs.append(down * root)
    return torch.cat(ups, dim=1), torch.cat(downs, dim=0)


def _title(path: str, metadata: dict[str, str]) -> str:
    title = metadata.get("modelspec.title")
    return title if title and title != "None" else Path(path).stem


def run(args: argparse.Namespace) -> int:
    ratios = _ratios(args)
    output = checked_output(args.output, args.overwrite, [("--inputs", p) for p in args.inputs])
    device = checked_device(args.device)
    files = [read_lora(path, "--inputs") for path in args.inputs]
    metadatas = [metadata for _, metadata in files]
    _check_base_models(args.inputs, metadatas, args.force)
    inputs = [
        svd.lora_modules(t, path, "merge-loras")
        for path, (t, _) in zip(args.inputs, files, strict=True)
    ]

    by_name: dict[str, list[tuple[str, svd.LoraModule, float]]] = {}
    for path, modules, ratio in zip(args.inputs, inputs, ratios, strict=True):
        for name, module in modules.items():
            by_name.setdefault(name, []).append((path, module, ratio))
    for name, parts in by_name.items():
        first_path, first, _ = parts[0]
        for path, module, _ in parts[1:]:
            if module.signature != first.signature:
                raise CheckpointError(
                    f"module {name} is {_shape(first)} in {first_path} but {_shape(module)} in "
                    f"{path}; LoRAs for different models cannot be merged"
                )

    dtype = DTYPES[args.save_precision] if args.save_precision else input_dtype(files[0][0])
    out: dict[str, torch.Tensor] = {}
    kept: dict[str, tuple[int, float, bool]] = {}
    fractions = []
    for name in sorted(by_name):
        parts = by_name[name]
        like = parts[0][1]
        up, down = _stacked(parts)
        if args.method == "concat":
            rank = up.shape[1]
            up, down = up.float(), down.float()
        else:
            decomposition = svd.svd_of_factors(up, down, device)
            ceiling = (args.conv_rank or args.rank) if like.spatial else args.rank
            rank = svd.choose_rank(decomposition.S, ceiling)
            fractions.append(svd.retained(decomposition.S, rank))
            up, down = svd.split(decomposition, rank)
        # alpha = rank: the inputs' alpha / r and ratios are already in the weights
        up, down = svd.module_shapes(up, down, like)
        out[f"{name}.{DOWN}"] = down
        out[f"{name}.{UP}"] = up
        out[f"{name}.{ALPHA}"] = torch.tensor(float(rank), dtype=torch.float32)
        kept[name] = (rank, float(rank), like.spatial)

    shown_ratios = " ".join(f"{r:g}" for r in ratios)
    refuse_non_finite_result(out, dtype, f"--ratios {shown_ratios}", "give smaller ratios")
    metadata = _metadata(args, ratios, metadatas, kept, output)
    write_file(output, out, metadata, dtype)

    ranks = sorted({rank for rank, _, _ in kept.values()})
    shown = "/".join(map(str, ranks)) if len(ranks) <= 4 else f"{ranks[0]}-{ranks[-1]}"
    partial = sum(1 for parts in by_name.values() if len(parts) < len(args.inputs))
    note = f" ({partial} of them not in every input)" if partial else ""
    kept_note = ""
    if fractions:
        kept_note = (
            f"; Frobenius norm of the sum kept: mean {sum(fractions) / len(fractions):.2%}, "
            f"min {min(fractions):.2%}"
        )
    sizes = " + ".join(human_size(Path(p).stat().st_size) for p in args.inputs)
    print(
        f"merged {len(args.inputs)} files ({args.method}): {len(by_name)} modules{note}, rank "
        f"{shown}{kept_note}; {sizes} -> {human_size(output.stat().st_size)}; wrote {output}"
    )
    return 0


def _metadata(args, ratios, metadatas, kept, output: Path) -> dict[str, str]:
    metadata: dict[str, str] = {}
    for key in _CARRIED:
        value = next((m[key] for m in metadatas if m.get(key) not in (None, "None")), None)
        if value is not None:
            metadata[key] = value
    metadata["ss_network_module"] = "networks.lora"
    metadata.update(svd.rank_metadata(kept, None))
    sources = ", ".join(
        f"{Path(path).name} x{ratio:g}" for path, ratio in zip(args.inputs, ratios, strict=True)
    )
    rank = "" if args.method == "concat" else f" to rank {args.rank}"
    metadata["ss_training_comment"] = (
        f"merged by lora_tool.py merge-loras ({args.method}{rank}) from {sources}"
    )
    metadata["modelspec.title"] = output.stem
    metadata["modelspec.merged_from"] = ", ".join(
        _title(path, m) for path, m in zip(args.inputs, metadatas, strict=True)
    )
    metadata["modelspec.date"] = datetime.fromtimestamp(int(time.time())).isoformat()
    return metadata
