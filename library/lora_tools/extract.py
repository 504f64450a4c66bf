"""``extract``: a LoRA of the difference between a fine-tuned model and its base.

For every layer a default difftune LoRA adapts (with ``--conv_rank``: LoCon's 3x3 convolutions
too), the change ``tuned - base`` is factored by a truncated SVD into ``up @ down`` of rank
``--rank`` (``--conv_rank`` for 3x3 convs) or a rank the ``--dynamic_method`` rule picks; alpha
is the rank (scale 1), as sd-scripts' extract_lora_from_models.py writes. The singular values
are split evenly between up and down (library/lora_tools/svd.py). FLUX.1's and SD3's fused
layers are factored per diffusers Linear and written as one block-diagonal kohya module, the
layout difftune's trainer writes, so ``network_weights`` loads the file into a LoRA of the same
rank. Layers whose largest change is at most ``--min_diff`` are skipped and listed. The file is
written in the layout difftune's trainer writes for the family (kohya's names, or the family's
own: ToolFacts.own_layout).
"""

from __future__ import annotations

import argparse
import math
import time
from datetime import datetime
from pathlib import Path

import torch

from library.errors import ConfigError, ModelError
from library.lora_tools.base_model import (
    Layer,
    add_model_arguments,
    component_label,
    default_layers,
    family_label,
    layer_table,
    load_model,
    model_inputs,
)
from library.lora_tools.common import (
    ALPHA,
    DOWN,
    DTYPES,
    UP,
    add_output_arguments,
    checked_device,
    checked_output,
    refuse_non_finite_result,
    write_file,
)
from library.lora_tools.from_kohya import kohya_to_layout
from library.lora_tools.layouts import own_layout
from library.lora_tools.svd import (
    RANK_METHODS,
    check_dynamic,
    choose_rank,
    rank_metadata,
    retained,
    split,
    svd_of_matrix,
)
from library.saving.metadata import MODELSPEC_VERSION

HELP = (
    "extract a LoRA from the difference between a fine-tuned model and its base (SVD), in the "
    "layout difftune's trainer writes for the family"
)
_LISTED = 10  # skipped layers named per component


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_model_arguments(
        parser,
        {
            "--base": "the base model the fine-tune started from",
            "--tuned": "the fine-tuned model (same family and sizes as --base)",
        },
    )
    parser.add_argument(
        "--rank",
        type=int,
        required=True,
        help="LoRA rank of Linear and 1x1 conv layers (the most kept with --dynamic_method)",
    )
    parser.add_argument(
        "--conv_rank",
        type=int,
        default=None,
        help="also extract the 3x3 convolutions of ResNet blocks and samplers (LoCon) at this "
        "rank (default: no conv modules, as a default LoRA)",
    )
    parser.add_argument(
        "--dynamic_method",
        choices=RANK_METHODS,
        default=None,
        help="choose each module's rank from its singular values (sd-scripts' rules): "
        "sv_ratio (largest / smallest kept <= param), sv_fro (fraction of the Frobenius norm "
        "kept >= param), sv_cumulative (fraction of the singular-value sum kept >= param); "
        "--rank / --conv_rank cap it",
    )
    parser.add_argument(
        "--dynamic_param", type=float, default=None, help="the number --dynamic_method uses"
    )
    parser.add_argument(
        "--min_diff",
        type=float,
        default=0.01,
        help="skip (and list) layers whose largest absolute weight change is at most this "
        "(default 0.01, sd-scripts' default; 0 extracts every changed layer)",
    )
    parser.add_argument(
        "--clamp_quantile",
        type=float,
        default=1.0,
        help="clamp up and down to this quantile of their values (sd-scripts uses 0.99 against "
        "outliers; default 1: no clamping, the factors reproduce the change exactly)",
    )
    parser.add_argument(
        "--device",
        default="cpu",
        help="where the SVDs run (cpu, cuda, cuda:1, ...; default cpu)",
    )
    add_output_arguments(parser, "extracted LoRA file")
    for action in parser._actions:  # there is no input LoRA whose dtype to keep
        if action.dest == "save_precision":
            action.help = "dtype of the written weights (default fp32)"


def run(args: argparse.Namespace) -> int:
    models = {"--base": args.base, "--tuned": args.tuned}
    output = checked_output(args.output, args.overwrite, model_inputs(args, models))
    if not math.isfinite(args.min_diff):
        raise ConfigError(f"--min_diff {args.min_diff}: give a finite number >= 0")
    check_dynamic(args.dynamic_method, args.dynamic_param)
    for flag, value in (("--rank", args.rank), ("--conv_rank", args.conv_rank)):
        if value is not None and value < 1:
            raise ConfigError(f"{flag} {value}: a rank is at least 1")
    if not 0 < args.clamp_quantile <= 1:
        raise ConfigError(f"--clamp_quantile {args.clamp_quantile}: give a number in (0, 1]")
    if args.min_diff < 0:
        raise ConfigError(f"--min_diff {args.min_diff}: give a number >= 0")
    device = checked_device(args.device)
    base = load_model(args, args.base, "--base")
    tuned = load_model(args, args.tuned, "--tuned")
    if base.family.name != tuned.family.name:
        raise ConfigError(
            f"--base is a {family_label(base.family)} model and --tuned a "
            f"{family_label(tuned.family)} one; extract needs a fine-tune of the base"
        )
    conv = args.conv_rank is not None
    layers = default_layers(base, conv)
    tuned_table = layer_table(tuned)
    tensors: dict[str, torch.Tensor] = {}
    ranks: dict[str, tuple[int, float, bool]] = {}
    skipped: dict[int, list[tuple[str, float]]] = {}
    kept = []
    with torch.no_grad():
        for name, layer in layers.items():
            other = tuned_table.get(name)
            if other is None or other.shape != layer.shape:
                raise ModelError(
                    f"--tuned {args.tuned}: layer {name} differs in shape from --base's; the "
                    "models are not a base and its fine-tune"
                )
            diffs = [  # tuned - base, per diffusers layer
                (tuned_layer.weight.float() - base_layer.weight.float())
                for base_layer, tuned_layer in zip(layer.modules, other.modules, strict=True)
            ]
            largest = max(float(d.abs().max()) for d in diffs)
            if largest <= args.min_diff:
                skipped.setdefault(layer.component, []).append((name, largest))
                continue
            spatial = diffs[0].dim() == 4 and tuple(diffs[0].shape[2:]) != (1, 1)
            cap = args.conv_rank if spatial else args.rank
            module, fro = _factor(layer, diffs, cap, args, device)
            tensors.update({f"{name}.{key}": value for key, value in module.items()})
            ranks[name] = (int(module[DOWN].shape[0]), float(module[ALPHA]), spatial)
            kept.append(fro)
    if not tensors:
        raise ConfigError(
            f"no layer of --tuned differs from --base by more than --min_diff {args.min_diff}; "
            "nothing to extract (lower --min_diff?)"
        )
    _report(base, skipped, args.min_diff)
    # named as the trainer names the family's files (kohya's, or the family's own layout)
    tensors, _ = kohya_to_layout(own_layout(base.family), tensors, {}, layer_table(base), base)
    dtype = DTYPES[args.save_precision or "fp32"]
    cause = f"--save_precision {args.save_precision or 'fp32'}"
    refuse_non_finite_result(tensors, dtype, cause)
    metadata = _metadata(base, ranks, args, output)
    write_file(output, tensors, metadata, dtype)
    print(
        f"wrote {output}: {len(ranks)} modules, ranks {min(r for r, _, _ in ranks.values())}-"
        f"{max(r for r, _, _ in ranks.values())}, at least {min(kept):.1%} of each change's "
        "Frobenius norm kept"
    )
    return 0


def _factor(layer: Layer, diffs: list[torch.Tensor], cap: int, args, device):
    """The kohya tensors of one layer's change (per-part SVDs, joined block-diagonally) and
    the smallest fraction of a part's Frobenius norm kept."""
    downs, ups, fros = [], [], []
    for diff in diffs:
        matrix = diff.reshape(diff.shape[0], -1)
        svd = svd_of_matrix(matrix, device)
        rank = choose_rank(svd.S, min(cap, *matrix.shape), args.dynamic_method, args.dynamic_param)
        up, down = split(svd, rank)
        if args.clamp_quantile < 1:
            up, down = _clamped(up, down, args.clamp_quantile)
        fros.append(retained(svd.S, rank))
        if diff.dim() == 4:  # conv: the kernel in down, a 1x1 up (LoCon's layout)
            down = down.reshape(rank, *diff.shape[1:])
            up = up.reshape(*up.shape, 1, 1)
        downs.append(down)
        ups.append(up)
    if len(diffs) == 1:
        down, up = downs[0], layer.join(ups)
    else:
        down = torch.cat(downs, dim=0)
        full = ups[0].new_zeros((sum(u.shape[0] for u in ups), down.shape[0]))
        row = col = 0
        for part in ups:
            full[row : row + part.shape[0], col : col + part.shape[1]] = part
            row, col = row + part.shape[0], col + part.shape[1]
        up = layer.join([full])
    # alpha = rank: scale 1, the factors are the change itself
    return {DOWN: down, UP: up, ALPHA: torch.tensor(float(down.shape[0]))}, min(fros)


def _clamped(up: torch.Tensor, down: torch.Tensor, quantile: float):
    """sd-scripts' outlier clamp: both factors to +-(the ``quantile`` of all their values)."""
    values = torch.cat([up.flatten(), down.flatten()])
    index = max(1, min(values.numel(), int(round(quantile * values.numel()))))
    high = float(values.kthvalue(index).values)
    return up.clamp(-high, high), down.clamp(-high, high)


def _report(components, skipped: dict[int, list[tuple[str, float]]], min_diff: float) -> None:
    for index, entries in sorted(skipped.items()):
        what = component_label(components, index)
        names = ", ".join(f"{name} ({change:.2g})" for name, change in entries[:_LISTED])
        more = f", and {len(entries) - _LISTED} more" if len(entries) > _LISTED else ""
        print(
            f"skipped {len(entries)} {what} layers changed by at most --min_diff {min_diff:g}: "
            f"{names}{more}"
        )


def _metadata(components, ranks, args, output: Path) -> dict[str, str]:
    """kohya's ss_* keys of a LoRA as the trainer writes them (network module, dims, base
    model version) and the modelspec keys of a LoRA file."""
    family = components.family
    has_text = any(not name.startswith(family.unet_lora_prefix) for name in ranks)
    has_unet = any(name.startswith(family.unet_lora_prefix) for name in ranks)
    size = family.default_resolution
    meta = {
        "ss_network_module": "networks.lora",
        "ss_base_model_version": family.base_model_version,
        "ss_v2": str(family.v2),
        "ss_v_parameterization": str(family.prediction_type == "v_prediction"),
        "ss_network_train_unet_only": str(not has_text),
        "ss_network_train_text_encoder_only": str(not has_unet),
        "ss_output_name": output.stem,
        "ss_training_comment": (
            f"extracted by lora_tool.py extract from {Path(args.tuned).name} minus "
            f"{Path(args.base).name}"
        ),
        **rank_metadata(ranks, None, dynamic=args.dynamic_method is not None),
        "modelspec.sai_model_spec": MODELSPEC_VERSION,
        "modelspec.architecture": family.lora_architecture,
        "modelspec.implementation": family.lora_implementation,
        "modelspec.title": output.stem,
        "modelspec.date": datetime.fromtimestamp(int(time.time())).isoformat(),
        "modelspec.resolution": f"{size}x{size}",
    }
    if family.prediction_type != "flow":
        meta["modelspec.prediction_type"] = family.modelspec_prediction_type
    return meta
