"""The one place that knows kohya's LoRA key names (see docs/formats.md, LoRA files).

A module of the model at path ``a.b.0.c`` is named ``<prefix>_a_b_0_c`` in a kohya file, with the
tensors ``<name>.lora_down.weight``, ``<name>.lora_up.weight`` and ``<name>.alpha``. Names are
mapped back to modules through a table built from the model's own paths, never by guessing which
underscores were dots. An SDXL UNet's paths are first renamed to the original SGM layout
(``down_blocks.1.attentions.0`` -> ``input_blocks.4.1``, library/models/original_names.py), the
names A1111 and ComfyUI expect; the same table maps them back on import.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import nn

from library.errors import CheckpointError
from library.networks.adapters import adapter_layers
from library.networks.kind_base import FileModule
from library.networks.kinds import kind_in
from library.networks.kohya_names import (
    KNOWN_PREFIXES,
    TEXT_ENCODER,
    UNetKeyLayout,
    kohya_name,
    kohya_path,
    prefix_of,
    unwrap,
)
from library.networks.module_files import adapted_paths, write_modules


def name_table(
    prefix: str, model: nn.Module, unet_key_layout: UNetKeyLayout | None = None
) -> dict[str, str]:
    """kohya module name -> module path for every adapted layer of ``model`` (a UNet's named
    in the layout ``unet_key_layout`` gives: kohya_names.kohya_path)."""
    model = unwrap(model)
    return {
        kohya_name(prefix, kohya_path(model, path, unet_key_layout)): path
        for path in adapter_layers(model)
    }


def plain_modules(
    prefix: str, model: nn.Module, unet_key_layout: UNetKeyLayout | None = None
) -> list[FileModule]:
    """One file module per adapted layer of ``model`` (unwrapped), under kohya's name for it."""
    return [
        FileModule(kohya_name(prefix, kohya_path(model, path, unet_key_layout)), (path,))
        for path in adapted_paths(model)
    ]


def export_lora(
    models: Mapping[str, nn.Module], unet_key_layout: UNetKeyLayout | None = None
) -> dict[str, torch.Tensor]:
    """All adapter tensors of ``models`` (prefix -> unwrapped model) as a kohya state dict
    (``unet_key_layout``: as for name_table).

    Each module holds its kind's tensors (library.networks.kinds): a LoRA's down and up weights
    in the adapter's dtype (float32) and a 0-d float32 alpha; a LyCORIS layer's own tensors under
    LyCORIS' suffixes (``<name>.hada_w1_a``, ...).
    """
    tensors: dict[str, torch.Tensor] = {}
    for prefix, model in models.items():
        model = unwrap(model)
        tensors.update(write_modules(model, plain_modules(prefix, model, unet_key_layout)))
    return tensors


def _unmatched_error(names: list[str], models: Mapping[str, nn.Module], source: str) -> str:
    """Explain file modules we have no adapter for, naming the fix. (Text-encoder modules of
    another family's prefixes are refused before, by lora_file_checks.check_text_prefixes,
    which asks the registry whose they are.)"""
    by_prefix: dict[str | None, list[str]] = {}
    for name in names:
        by_prefix.setdefault(prefix_of(name), []).append(name)
    for prefix, group in by_prefix.items():
        if prefix is not None and prefix not in models:
            what, fix = KNOWN_PREFIXES[prefix]
            return (
                f"{source}: has LoRA weights for the {what} ({len(group)} modules, e.g. "
                f"{group[0]}) but the {what} is not being trained; {fix}, or use a file "
                "without them"
            )
    example = names[0]
    if all(_looks_conv(name) for name in names):
        return (
            f"{source}: has conv (LoCon) LoRA weights for {len(names)} ResNet/sampler layers, "
            f"e.g. {example}, but conv_dim is not set; set conv_dim to the file's conv rank"
        )
    return (
        f"{source}: {len(names)} modules in the file are not adapted by this model, e.g. "
        f"{example}; the file was made for a different model or network settings"
    )


def _missing_error(missing: list[str], total: int, source: str) -> str:
    """Explain adapted layers the file has no weights for, naming the fix."""
    if all((prefix_of(name) or "").startswith(TEXT_ENCODER) for name in missing):
        fix = "it has no text-encoder LoRA; set network_train_unet_only = true"
    elif all(_looks_conv(name) for name in missing):
        fix = "it has no conv (LoCon) LoRA; remove conv_dim"
    else:
        fix = "it was trained on other layers (check conv_dim and network_train_* settings)"
    return (
        f"{source}: lacks {len(missing)} of the {total} adapted modules, e.g. {missing[0]}; {fix}"
    )


def _looks_conv(name: str) -> bool:
    return any(part in name for part in ("_resnets_", "_downsamplers_", "_upsamplers_"))


def import_lora(
    models: Mapping[str, nn.Module],
    tensors: Mapping[str, torch.Tensor],
    source: str,
    unet_key_layout: UNetKeyLayout | None = None,
) -> None:
    """Copy a kohya file's down/up weights and alphas into the already-injected adapters.

    ``models`` maps prefix -> adapted model, ``source`` names the file in errors and
    ``unet_key_layout`` says how a UNet's modules are named (name_table). Every file
    module must match an adapted layer and every adapted layer must be in the file, with the
    same rank and shapes; a module without alpha gets alpha = rank. Everything is checked
    before anything is copied, so a refused file leaves the adapters as they were.
    """
    models = {prefix.rstrip("_"): unwrap(model) for prefix, model in models.items()}
    table: dict[str, nn.Module] = {}
    for prefix, model in models.items():
        layers = adapter_layers(model)
        for name, path in name_table(prefix, model, unet_key_layout).items():
            table[name] = layers[path]
    # the file's tensors are the adapters' kind's to group, check and load
    kind = kind_in(models.values())
    groups = kind.group_tensors(tensors, source)
    unmatched = sorted(set(groups) - set(table))
    if unmatched:
        raise CheckpointError(_unmatched_error(unmatched, models, source))
    missing = sorted(set(table) - set(groups))
    if missing:
        raise CheckpointError(_missing_error(missing, len(table), source))
    kind.load_modules(table, groups, source)


