"""``check``: which keys of a LoRA file a loader would drop or not understand, and why.

Three loaders, each checked against the loaded base model:

- difftune (check_difftune.py): the trainer's ``network_weights`` import. Every module must
  name a layer a difftune adapter can sit on (a default LoRA's layers with LoCon's convs;
  LyCORIS' "full" preset for LyCORIS files on the families that train them) with tensors of
  fitting shapes; a file that passes is then really imported, into adapters injected with the
  file's ranks, by the trainer's own import (library/networks/network_weights.py), which decides
  which layouts the family reads.
- diffusers (check_diffusers.py): the family's pipeline runs its own ``load_lora_weights`` on
  the file (diffusers' key conversion, then peft); afterwards each module's weight change in the
  adapted model is compared with the file's. A module diffusers did not load, or loaded with
  another change, is reported with what diffusers logged.
- comfyui (check_comfyui.py, comfyui_keys.py): a reproduction of ComfyUI's LoRA key map
  (comfy/lora.py ``model_lora_keys_unet`` / ``model_lora_keys_clip`` and ``load_lora``, read
  from Comfy-Org/ComfyUI in 2026): which module names it accepts for this model and which tensor
  suffixes it reads under them; every other key is one ComfyUI logs as "lora key not loaded".
  Written from those facts, no ComfyUI code.

Each check gets the file's keys sorted by the model's layers, whatever the file's layout
(file_modules.py), and answers with a Report (loader_report.py).

A diffusers ``lora_adapter_metadata`` header that is not what diffusers writes (not a JSON
object, an alpha that is not a finite number) is refused before any loader runs
(library/networks/peft_metadata.py). Tensors holding NaN or infinite values are reported
before the loaders: every loader reads
them, and a model they are applied to computes NaN.

Exit status: 0 when no checked loader drops anything and every tensor is finite, 1 otherwise,
2 for bad input.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

from library.lora_tools.base_model import add_model_arguments, family_label, layer_table, load_model
from library.lora_tools.check_comfyui import check_comfyui
from library.lora_tools.check_difftune import check_difftune
from library.lora_tools.check_diffusers import check_diffusers
from library.lora_tools.common import first_non_finite
from library.lora_tools.file_modules import sort_keys
from library.lora_tools.layouts import layout_words
from library.lora_tools.loader_report import Report, print_report
from library.networks.peft_metadata import peft_configs
from library.saving.lora_file import read_safetensors

HELP = (
    "list the keys of a LoRA file that difftune, diffusers or ComfyUI would drop or not "
    "understand, and why, and tensors that are not finite (exit 1 if any, 0 if none)"
)
LOADERS = ("difftune", "diffusers", "comfyui")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--lora", required=True, metavar="FILE", help="the LoRA file to check")
    add_model_arguments(parser, {"--model": "the base model the file is meant for"})
    parser.add_argument(
        "--loader",
        choices=(*LOADERS, "all"),
        default="all",
        help="which loader to check against (default all). Exit status: 0 when nothing is "
        "dropped and every tensor is finite, 1 otherwise, 2 for bad input",
    )


def run(args: argparse.Namespace) -> int:
    tensors, metadata = read_safetensors(args.lora)
    peft_configs(metadata, args.lora)  # every loader reads that header: refuse a broken one once
    components = load_model(args, args.model)
    table = layer_table(components)
    found = sort_keys(tensors, metadata, components, table, args.lora)
    chosen = LOADERS if args.loader == "all" else (args.loader,)
    # ComfyUI's check only reads names; the other two inject adapters and take them out again.
    checks: dict[str, Callable[..., Report]] = {
        "comfyui": check_comfyui,
        "difftune": check_difftune,
        "diffusers": check_diffusers,
    }
    label = family_label(components.family)
    layout = layout_words(found.layout, components.family)
    print(f"{args.lora}: {len(tensors)} keys in the {layout}, against a {label} model")
    failed = _report_non_finite(tensors)
    for loader in chosen:
        report = checks[loader](found, tensors, metadata, components, table, args.lora)
        failed |= bool(report.dropped)
        print_report(report, len(tensors))
    return 1 if failed else 0


def _report_non_finite(tensors) -> bool:
    """Print the tensors that hold NaN or infinite values; whether there are any."""
    broken = []
    for key in sorted(tensors):
        if first_non_finite({key: tensors[key]}) is not None:
            broken.append(key)
    if not broken:
        return False
    print(
        f"not finite: {len(broken)} of {len(tensors)} tensors hold NaN or infinite values; every "
        "loader reads them and the adapted model computes NaN (a training that diverged?)"
    )
    for key in broken:
        print(f"    {key}")
    return True
