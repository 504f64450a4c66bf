"""``metadata``: show a LoRA/LyCORIS file's header and what its tensors are, or change the header.

Showing prints a summary line (modules, algorithms, ranks, alphas, dtypes, prefixes) and every
metadata key, sorted, with long values shortened unless --full; --json prints the same for
programs, values in full. Editing (--set / --remove) writes a new file (--output) or replaces
the input atomically (--in_place, the one case a toolbox command replaces its input); the
tensors are written back bit for bit and kohya's sshs_* hashes are recomputed.
"""

from __future__ import annotations

import argparse
import json
import re
from collections import Counter
from collections.abc import Mapping
from pathlib import Path

import torch

from library.errors import ConfigError
from library.lora_tools.common import (
    checked_output,
    hold_output,
    module_algorithm,
    module_groups,
    refuse_clash,
    write_file_unchanged,
)
from library.saving.lora_file import read_safetensors

HELP = "show or edit the metadata of a LoRA/LyCORIS file (tensors are kept bit for bit)"

SHORT = 100  # characters of a value shown without --full
# kohya's long JSON values, always shortened without --full
_LONG_KEYS = ("ss_tag_frequency", "ss_dataset_dirs", "ss_bucket_info", "ss_datasets")
_DTYPE_NAMES = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16"}
# kohya's flat prefixes, and the dotted heads of the names that keep a module path
# (diffusion_model.<path>, as difftune writes some families' files)
_PREFIX = re.compile(r"^(?:(lora_unet|lora_te\d?|lora_transformer|lycoris)_|(diffusion_model)\.)")
_HASH_KEYS = ("sshs_model_hash", "sshs_legacy_hash")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--input", required=True, help="the file to show or edit")
    parser.add_argument(
        "--full", action="store_true", help="show long values (tag frequencies, ...) in full"
    )
    parser.add_argument(
        "--json", action="store_true", help="print summary and metadata as JSON (values in full)"
    )
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="set a metadata key (repeatable); the value is stored as the string given",
    )
    parser.add_argument(
        "--remove", action="append", default=[], metavar="KEY", help="remove a key (repeatable)"
    )
    parser.add_argument("--output", default=None, help="write the edited file here")
    parser.add_argument(
        "--overwrite", action="store_true", help="replace --output if it exists (default: refuse)"
    )
    parser.add_argument(
        "--in_place",
        action="store_true",
        help="replace the input with the edited file (atomically); only with --set/--remove",
    )


def _module_rank(parts: Mapping[str, torch.Tensor]) -> int | None:
    for key in ("lora_down.weight", "hada_w1_b", "lokr_w1_b", "lokr_w2_b"):
        if key in parts and parts[key].ndim >= 1:
            return int(parts[key].shape[0])
    return None


def _module_alpha(parts: Mapping[str, torch.Tensor]) -> float | None:
    """The alpha loaders use: the stored one, else the rank (kohya's and LyCORIS' default)."""
    alpha = parts.get("alpha")
    if alpha is not None and alpha.numel() == 1:
        return float(alpha.float().item())
    rank = _module_rank(parts)
    return None if rank is None else float(rank)


def summary(tensors: Mapping[str, torch.Tensor]) -> dict:
    """What the tensors hold: module count, algorithms, ranks, alphas (a missing one counted as
    the rank), dtypes and prefixes."""
    groups = module_groups(tensors)
    algorithms = Counter(module_algorithm(parts) for parts in groups.values())
    ranks = sorted({r for parts in groups.values() if (r := _module_rank(parts)) is not None})
    alphas = sorted({a for parts in groups.values() if (a := _module_alpha(parts)) is not None})
    dtypes = sorted(
        {
            _DTYPE_NAMES.get(t.dtype, str(t.dtype).removeprefix("torch."))
            for key, t in tensors.items()
            if not key.endswith(".alpha")
        }
    )
    prefixes = Counter()
    for name in groups:
        match = _PREFIX.match(name)
        prefixes[(match.group(1) or match.group(2)) if match else "other"] += 1
    return {
        "modules": len(groups),
        "algorithms": dict(sorted(algorithms.items())),
        "ranks": ranks,
        "alphas": alphas,
        "dtypes": dtypes,
        "prefixes": dict(sorted(prefixes.items())),
    }


def _listing(values: list) -> str:
    if not values:
        return "-"
    if len(values) > 6:
        return f"{values[0]:g}..{values[-1]:g} ({len(values)} values)"
    return "/".join(f"{v:g}" for v in values)


def summary_line(path: str, info: dict) -> str:
    algorithms = ", ".join(
        name if len(info["algorithms"]) == 1 else f"{name} x{count}"
        for name, count in info["algorithms"].items()
    )
    prefixes = ", ".join(f"{name} ({count})" for name, count in info["prefixes"].items())
    return (
        f"{path}: {info['modules']} modules, {algorithms or 'no modules'}, rank "
        f"{_listing(info['ranks'])}, alpha {_listing(info['alphas'])}, "
        f"{'/'.join(info['dtypes']) or '-'}, prefixes {prefixes or '-'}"
    )


def _shown(key: str, value: str, full: bool) -> str:
    if full:
        return value
    flat = value.replace("\r", "\\r").replace("\n", "\\n")
    if len(flat) > SHORT or (key in _LONG_KEYS and len(flat) > 40):
        keep = 40 if key in _LONG_KEYS else SHORT - 20
        return f"{flat[:keep]}... ({len(value)} characters; --full shows all)"
    return flat


def _show(args: argparse.Namespace, tensors, metadata: dict[str, str]) -> int:
    info = summary(tensors)
    if args.json:
        document = {"file": args.input, "summary": info, "metadata": dict(sorted(metadata.items()))}
        print(json.dumps(document, indent=2, ensure_ascii=False))
        return 0
    print(summary_line(args.input, info))
    if not metadata:
        print("metadata: none")
        return 0
    print(f"metadata ({len(metadata)} keys):")
    width = max(len(key) for key in metadata)
    for key in sorted(metadata):
        print(f"  {key:{width}}  {_shown(key, metadata[key], args.full)}")
    return 0


def _edits(args: argparse.Namespace, metadata: dict[str, str]) -> tuple[dict[str, str], list[str]]:
    """(key -> new value, keys to remove), checked against the file's metadata."""
    changes: dict[str, str] = {}
    for item in args.set:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"--set {item}: write KEY=VALUE (e.g. --set ss_output_name=mylora)")
        if key in _HASH_KEYS:
            raise ConfigError(
                f"--set {key}: the hashes are recomputed whenever the file is written"
            )
        changes[key] = value
    removals = []
    for key in args.remove:
        if key in changes:
            raise ConfigError(f"--remove {key}: the same key is also given to --set")
        if key in _HASH_KEYS:
            raise ConfigError(
                f"--remove {key}: the hashes are recomputed whenever the file is written"
            )
        if key not in metadata:
            raise ConfigError(f"--remove {key}: {args.input} has no such metadata key")
        removals.append(key)
    return changes, removals


def run(args: argparse.Namespace) -> int:
    editing = bool(args.set or args.remove)
    if args.output and args.in_place:
        raise ConfigError("--output and --in_place: choose one (a new file, or replace the input)")
    if (args.output or args.in_place) and not editing:
        raise ConfigError(
            f"{'--output' if args.output else '--in_place'}: nothing to change; add --set or --remove"
        )
    if editing and not (args.output or args.in_place):
        raise ConfigError("--set/--remove need --output FILE (a new file) or --in_place")
    if editing and (args.json or args.full):
        raise ConfigError("--json and --full are for showing a file; leave them out when editing")
    if args.output:
        try:
            refuse_clash("--output", Path(args.output), [("--input", args.input)])
        except ConfigError as exc:
            raise ConfigError(
                f"--output {args.output} is the input file; use --in_place to replace it"
            ) from exc
        target = checked_output(args.output, args.overwrite)
    if editing and args.in_place and Path(args.input).is_file():
        hold_output(Path(args.input), "--in_place")  # two edits at once would lose one
    tensors, metadata = read_safetensors(args.input)
    if not editing:
        return _show(args, tensors, metadata)
    target = Path(args.input) if args.in_place else target
    changes, removals = _edits(args, metadata)
    edited = {k: v for k, v in metadata.items() if k not in removals}
    edited.update(changes)
    write_file_unchanged(target, tensors, edited)
    done = []
    if changes:
        done.append("set " + ", ".join(changes))
    if removals:
        done.append("removed " + ", ".join(removals))
    print(f"wrote {target}: {'; '.join(done)}; tensors unchanged, hashes recomputed")
    return 0
