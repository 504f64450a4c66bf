"""``merge``: bake LoRA / LyCORIS files into a base model and write the merged model.

Each file's modules are matched to the model's layers by kohya's names (library/lora_tools/
base_model.py; diffusers- and ComfyUI-layout files are renamed first, as ``convert`` does), and
each layer's weight becomes what a reader computes with the file at ``ratio``: ``W + ratio *
alpha / r * up @ down`` for a LoRA, LyCORIS' own formula for LoHa, LoKr, Tucker LoCon and DoRA
(library/networks/lycoris/file_math.py). Files are merged one after the other, in the order
given. A fused FLUX.1 / SD3 module changes all of its diffusers Linears at once.

The merged model is written as the trainer writes a full fine-tune: ``--output`` one file in the
family's layout (family.write_full_model: SD 1.x/2.x/SDXL a single original-layout checkpoint
with VAE and text encoders; FLUX.1 the transformer in Black Forest Labs' layout; SD3 the MMDiT
and VAE in Stability's), ``--output_dir`` a diffusers folder (the base folder's other parts
copied, the merged UNet/transformer and text encoders written), for a diffusers-folder base.
"""

from __future__ import annotations

import argparse
import json
import shutil
import time
from datetime import datetime
from pathlib import Path

import torch

from library.errors import CheckpointError, ConfigError
from library.lora_tools.base_model import (
    DENOISER,
    add_model_arguments,
    component_label,
    family_label,
    layer_table,
    load_model,
    model_inputs,
)
from library.lora_tools.common import (
    DTYPES,
    checked_output,
    hold_output,
    ratios_for,
    read_lora,
    refuse_clash,
    refuse_non_finite_result,
    writing,
)
from library.lora_tools.layouts import unknown_modules_message
from library.lora_tools.to_kohya import to_kohya
from library.networks.kohya_names import group_modules
from library.networks.lycoris import file_math
from library.saving.atomic import atomic_write_dir
from library.saving.checkpoint_export import ensure_text_model_layout
from library.saving.metadata import MODELSPEC_VERSION

HELP = (
    "bake LoRA/LyCORIS files into a base model and write the merged model (a checkpoint file "
    "and/or a diffusers folder)"
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_model_arguments(parser, {"--model": "the base model to merge into"})
    parser.add_argument(
        "--loras",
        required=True,
        nargs="+",
        metavar="FILE",
        help="LoRA / LyCORIS files (kohya, diffusers or ComfyUI layout), merged in this order",
    )
    parser.add_argument(
        "--ratios",
        nargs="+",
        type=float,
        metavar="R",
        default=None,
        help="strength of each file, one per --loras entry, from -100 to 100 (default: 1.0 "
        "each); a LoRA adds ratio * alpha / rank * up @ down",
    )
    parser.add_argument(
        "--output",
        metavar="FILE",
        default=None,
        help="write the merged model as one .safetensors file, in the layout the trainer writes "
        "a full fine-tune in (SD/SDXL: an original-layout checkpoint with VAE and text "
        "encoders; FLUX.1: the transformer alone; SD3: MMDiT and VAE)",
    )
    parser.add_argument(
        "--output_dir",
        metavar="FOLDER",
        default=None,
        help="write the merged model as a diffusers folder (needs a diffusers-folder --model, "
        "whose tokenizers, scheduler and other parts are copied)",
    )
    parser.add_argument(
        "--overwrite",
        action="store_true",
        help="replace --output / --output_dir if they exist (default: refuse)",
    )
    parser.add_argument(
        "--save_precision",
        choices=sorted(DTYPES),
        default=None,
        help="dtype of the written weights (default: --precision)",
    )
    parser.add_argument(
        "--skip_unknown",
        action="store_true",
        help="leave out (and list) LoRA modules that name no layer of the model instead of "
        "refusing the file",
    )
    parser.add_argument(
        "--denoiser_only",
        action="store_true",
        help="merge only the UNet / transformer modules; text-encoder modules are left out and "
        "listed (needed for a FLUX.1 or SD3 --output, whose file holds no text encoders)",
    )


def run(args: argparse.Namespace) -> int:
    if args.output is None and args.output_dir is None:
        raise ConfigError("give --output FILE.safetensors and/or --output_dir FOLDER")
    inputs = [*model_inputs(args, {"--model": args.model}), *(("--loras", p) for p in args.loras)]
    output = checked_output(args.output, args.overwrite, inputs) if args.output else None
    folder = _checked_folder(args.output_dir, args.overwrite, inputs) if args.output_dir else None
    ratios = _ratios(args)
    files = [read_lora(path, "--loras") for path in args.loras]  # bad files fail before loading
    components = load_model(args, args.model)
    if folder is not None and not components.model_dir.is_dir():
        raise ConfigError(
            f"--output_dir needs a diffusers-folder --model (its tokenizers, scheduler and "
            f"other parts are copied), and {args.model} is a single file; use --output"
        )
    written = _written_components(components, output is not None, folder is not None)
    table = layer_table(components)
    plans, skipped = [], []
    for path, (tensors, metadata), ratio in zip(args.loras, files, ratios, strict=True):
        modules, left_out = _plan(path, tensors, metadata, components, table, written, args)
        plans.append((path, ratio, modules))
        skipped.extend(left_out)
    dtype = DTYPES[args.save_precision or args.precision]
    changed = set()
    for path, ratio, modules in plans:
        for name, parts in modules.items():
            layer = table[name]
            merged = _merged(layer.weight, parts, ratio, path, name)
            # the layer keeps --precision, the file --save_precision: both must hold the result
            cause = f"--ratios {ratio:g} ({path})"
            for held in {dtype, layer.weight.dtype}:
                refuse_non_finite_result({name: merged}, held, cause, "give a smaller ratio")
            layer.set_weight(merged)
            changed.add(layer.component)
        print(f"merged {len(modules)} modules of {path} at ratio {ratio:g}")
    for line in skipped:
        print(f"left out: {line}")
    metadata = _model_metadata(components, args.loras, ratios, output or folder)
    if output is not None:
        with writing(output):
            family = components.family
            family.write_full_model(output, components.denoiser, components, metadata, dtype)
        print(f"wrote {output}")
    if folder is not None:
        with writing(folder, "--output_dir"):
            write_model_folder(folder, components, changed, dtype, replace_vae=bool(args.vae))
        print(f"wrote {folder}")
    return 0


def _ratios(args: argparse.Namespace) -> list[float]:
    return ratios_for(args.ratios, len(args.loras), "--loras files")


def _checked_folder(path: str, overwrite: bool, inputs) -> Path:
    folder = Path(path)
    refuse_clash("--output_dir", folder, inputs)
    if folder.parent.is_dir():
        hold_output(folder, "--output_dir")  # to the command's end: a second one stops now
    if folder.exists() and not overwrite:
        raise ConfigError(f"--output_dir {folder} exists; choose another name or add --overwrite")
    if folder.exists() and not folder.is_dir():
        raise ConfigError(f"--output_dir {folder} is a file; give a folder")
    if not folder.parent.is_dir():
        raise ConfigError(
            f"--output_dir {folder}: folder {folder.parent} does not exist; create it first"
        )
    return folder


def _written_components(components, to_file: bool, to_folder: bool) -> set[int]:
    """The components (DENOISER, text encoder indices) some output holds."""
    written = set()
    if to_folder:
        written |= {DENOISER, *range(len(components.text_encoders))}
    if to_file:
        held = {id(module) for module in components.family.full_model_modules(components)}
        if id(components.denoiser) in held:
            written.add(DENOISER)
        written |= {i for i, e in enumerate(components.text_encoders) if id(e) in held}
    return written


def _plan(path, tensors, metadata, components, table, written, args):
    """({kohya name: {suffix: tensor}} to merge, lines of modules left out) of one file;
    ConfigError / CheckpointError for modules that cannot be merged."""
    foreign: list[str] = []  # keys of a diffusers / ComfyUI file that name no layer
    tensors, metadata = to_kohya(tensors, metadata, components, table, path, foreign)
    groups = group_modules(tensors)
    unknown = sorted(name for name in groups if name not in table)
    if (unknown or foreign) and not args.skip_unknown:
        message = unknown_modules_message(unknown or sorted(foreign), metadata, components, path)
        raise CheckpointError(f"{message}; or add --skip_unknown to merge the rest")
    left_out = [f"{path}: {name} (no such layer in the model)" for name in unknown + foreign]
    modules = {}
    unwritten: dict[int, list[str]] = {}
    for name in sorted(set(groups) - set(unknown)):
        layer = table[name]
        if layer.component != DENOISER and args.denoiser_only:
            left_out.append(f"{path}: {name} (--denoiser_only)")
            continue
        if layer.component not in written:
            unwritten.setdefault(layer.component, []).append(name)
            continue
        modules[name] = groups[name]
    if unwritten:
        index, names = next(iter(unwritten.items()))
        what = component_label(components, index)
        raise ConfigError(
            f"{path}: {len(names)} modules change the {what} (e.g. {names[0]}), which a "
            f"{family_label(components.family)} --output file does not hold; add --output_dir "
            "(a diffusers folder holds it) or --denoiser_only to leave them out"
        )
    return modules, left_out


def _merged(weight: torch.Tensor, parts, ratio: float, path, name) -> torch.Tensor:
    """The layer's weight with one file module merged at ``ratio`` (float32)."""
    try:
        return file_math.merged_weight(weight, parts, ratio)
    except ValueError as exc:
        raise CheckpointError(f"{path}: module {name}: {exc}") from None


def _model_metadata(components, loras, ratios, output) -> dict[str, str]:
    """modelspec keys of the merged model, and which files at which ratios made it."""
    family = components.family
    size = family.default_resolution
    meta = {
        "modelspec.sai_model_spec": MODELSPEC_VERSION,
        "modelspec.architecture": family.modelspec_architecture,
        "modelspec.implementation": family.checkpoint_implementation,
        "modelspec.title": Path(output).stem,
        "modelspec.date": datetime.fromtimestamp(int(time.time())).isoformat(),
        "modelspec.resolution": f"{size}x{size}",
        "modelspec.merged_from": ", ".join(
            [Path(components.model_dir).name, *(Path(p).name for p in loras)]
        ),
        "difftune.merged_loras": json.dumps(
            [{"file": Path(p).name, "ratio": r} for p, r in zip(loras, ratios, strict=True)]
        ),
    }
    if family.prediction_type != "flow":
        meta["modelspec.prediction_type"] = family.modelspec_prediction_type
    return meta


def write_model_folder(folder: Path, components, changed: set[int], dtype, replace_vae: bool):
    """A diffusers folder: the base folder's parts, with the merged denoiser and the changed
    text encoders (and a --vae replacement) written in place of theirs, atomically."""
    from safetensors.torch import save_file

    family = components.family
    base_dir = Path(components.model_dir)
    denoiser_sub = family.denoiser_subfolder
    encoder_subs = {
        family.text_encoder_subfolders[i]: components.text_encoders[i]
        for i in sorted(changed - {DENOISER})
    }
    replaced = {denoiser_sub, *encoder_subs, *(("vae",) if replace_vae else ())}

    def cast(module):
        return {k: v.detach().to("cpu", dtype).contiguous() for k, v in module.state_dict().items()}

    def write(tmp: Path) -> None:
        for entry in base_dir.iterdir():
            if entry.name in replaced:
                continue
            if entry.is_dir():
                shutil.copytree(entry, tmp / entry.name)
            else:
                shutil.copy2(entry, tmp / entry.name)
        (tmp / denoiser_sub).mkdir()
        components.denoiser.save_config(tmp / denoiser_sub)
        save_file(
            cast(components.denoiser), tmp / denoiser_sub / "diffusion_pytorch_model.safetensors"
        )
        if replace_vae:
            (tmp / "vae").mkdir()
            components.vae.save_config(tmp / "vae")
            save_file(cast(components.vae), tmp / "vae" / "diffusion_pytorch_model.safetensors")
        for sub, encoder in encoder_subs.items():
            (tmp / sub).mkdir()
            encoder.config.to_json_file(str(tmp / sub / "config.json"))
            save_file(cast(encoder), tmp / sub / "model.safetensors", metadata={"format": "pt"})
        for sub in family.text_encoder_subfolders:
            # transformers 4.x re-initialises CLIP weights saved without text_model.
            if (tmp / sub).is_dir():
                ensure_text_model_layout(tmp / sub)

    atomic_write_dir(folder, write)
