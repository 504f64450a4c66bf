"""``convert``: one LoRA file between kohya's, diffusers' (peft) and ComfyUI's key layouts.

layouts.py describes the three layouts and tells which one a file is in; from_kohya.py writes
kohya modules in the other two, to_kohya.py reads them back.

Converting there and back gives the input again bit for bit: names change, tensors do not
(diffusers' per-Linear parts of a fused module are slices of it; the kohya alphas and shapes are
kept in the header entry ``difftune.kohya_modules`` for the way back).
"""

from __future__ import annotations

import argparse

from library.errors import ConfigError
from library.lora_tools.base_model import (
    add_model_arguments,
    layer_table,
    load_model,
    model_inputs,
)
from library.lora_tools.common import (
    DTYPES,
    add_output_arguments,
    checked_output,
    read_lora,
    refuse_non_finite_result,
    write_file_unchanged,
)
from library.lora_tools.from_kohya import kohya_to_layout
from library.lora_tools.layouts import (
    LAYOUTS,
    OWN,
    check_kohya_names,
    chosen_layout,
    detect_layout,
    layout_words,
)
from library.lora_tools.to_kohya import to_kohya

HELP = (
    "convert a LoRA file between kohya's, diffusers' (peft) and ComfyUI's key layouts "
    "(needs the base model to map the names)"
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--input", required=True, metavar="FILE", help="the LoRA file to convert")
    parser.add_argument(
        "--to",
        required=True,
        choices=(*LAYOUTS, OWN),
        help="the layout to write: kohya (sd-scripts, A1111/Forge, musubi-tuner), diffusers "
        "(pipe.load_lora_weights / peft), comfyui (ComfyUI's own saved LoRAs: "
        "diffusion_model.*), or difftune: the one difftune's trainer writes for the --model's "
        "family (kohya's; comfyui's for a family whose files name diffusers paths)",
    )
    add_model_arguments(
        parser,
        {
            "--model": "the base model the LoRA is for; needed to map kohya's module names to "
            "diffusers' and ComfyUI's module paths (and back)"
        },
        precision=False,
    )
    parser.add_argument(
        "--fold_alpha",
        action="store_true",
        help="--to diffusers: multiply each module's alpha / rank into lora_B (scale 1 for every "
        "reader) instead of keeping alpha in the lora_adapter_metadata header; converting "
        "back then gives alpha = rank (the same weight change, other numbers)",
    )
    add_output_arguments(parser, "converted LoRA file")


def run(args: argparse.Namespace) -> int:
    inputs = [("--input", args.input), *model_inputs(args, {"--model": args.model})]
    output = checked_output(args.output, args.overwrite, inputs)
    if args.fold_alpha and args.to not in ("diffusers", OWN):
        raise ConfigError("--fold_alpha applies to --to diffusers only; remove it")
    tensors, metadata = read_lora(args.input, "--input")
    source = detect_layout(tensors, args.input)
    if source == args.to:
        raise ConfigError(
            f"--input {args.input} is already in the {args.to} layout; nothing to convert"
        )
    components = load_model(args, args.model)
    target = chosen_layout(args.to, components.family)
    if args.fold_alpha and target != "diffusers":
        raise ConfigError(
            f"--fold_alpha applies to --to diffusers only, and --to {args.to} is the "
            f"{target} layout here; remove it"
        )
    if source == target:
        raise ConfigError(
            f"--input {args.input} is already in the "
            f"{layout_words(target, components.family)}; nothing to convert"
        )
    table = layer_table(components)
    kohya, meta = (
        (tensors, metadata)
        if source == "kohya"
        else to_kohya(tensors, metadata, components, table, args.input)
    )
    if target != "kohya":
        check_kohya_names(kohya, meta, table, components, args.input)
    out, out_meta = kohya_to_layout(target, kohya, meta, table, components, args.fold_alpha)
    dtype = DTYPES[args.save_precision] if args.save_precision else None
    if dtype is not None:
        cause = f"--save_precision {args.save_precision}"
        refuse_non_finite_result(out, dtype, cause)
    write_file_unchanged(output, out, out_meta, dtype, hashes="sshs_model_hash" in metadata)
    print(
        f"converted {args.input} ({layout_words(source, components.family)}; {len(tensors)} "
        f"tensors) to the {layout_words(target, components.family)}: {output} ({len(out)} "
        "tensors)"
    )
    return 0
