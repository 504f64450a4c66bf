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
from library.models.families.registry import text_prefix_line, text_prefix_lines
from library.networks.adapters import adapter_layers
from library.networks.kind_base import FileModule
from library.networks.kinds import kind_in
from library.networks.kohya_names import (
    KNOWN_PREFIXES,
    TEXT_ENCODER,
    UNET,
    kohya_name,
    kohya_path,
    unwrap,
)
from library.networks.module_files import adapted_paths, write_modules


def name_table(prefix: str, model: nn.Module) -> dict[str, str]:
    """kohya module name -> module path for every adapted layer of ``model``."""
    model = unwrap(model)
    return {kohya_name(prefix, kohya_path(model, path)): path for path in adapter_layers(model)}


def plain_modules(prefix: str, model: nn.Module) -> list[FileModule]:
    """One file module per adapted layer of ``model`` (unwrapped), under kohya's name for it."""
    return [
        FileModule(kohya_name(prefix, kohya_path(model, path)), (path,))
        for path in adapted_paths(model)
    ]


def export_lora(models: Mapping[str, nn.Module]) -> dict[str, torch.Tensor]:
    """All adapter tensors of ``models`` (prefix -> unwrapped model) as a kohya state dict.

    Each module holds its kind's tensors (library.networks.kinds): a LoRA's down and up weights
    in the adapter's dtype (float32) and a 0-d float32 alpha; a LyCORIS layer's own tensors under
    LyCORIS' suffixes (``<name>.hada_w1_a``, ...).
    """
    tensors: dict[str, torch.Tensor] = {}
    for prefix, model in models.items():
        model = unwrap(model)
        tensors.update(write_modules(model, plain_modules(prefix, model)))
    return tensors


def _prefix_of(name: str) -> str | None:
    """The longest known kohya prefix ``name`` starts with (lora_te1 before lora_te)."""
    for prefix in sorted(KNOWN_PREFIXES, key=len, reverse=True):
        if name.startswith(prefix + "_"):
            return prefix
    return None


def _unmatched_error(
    names: list[str],
    models: Mapping[str, nn.Module],
    source: str,
    text_prefixes: tuple[str, ...] | None,
) -> str:
    """Explain file modules we have no adapter for, naming the fix."""
    by_prefix: dict[str | None, list[str]] = {}
    for name in names:
        by_prefix.setdefault(_prefix_of(name), []).append(name)
    for prefix, group in by_prefix.items():
        if prefix is None or prefix == UNET or text_prefixes is None or prefix in text_prefixes:
            continue
        # text-encoder weights of another family: no setting makes this model load them
        made_for = " or ".join(text_prefix_lines(prefix))
        this = text_prefix_line(tuple(text_prefixes)) or "another family"
        return (
            f"{source}: is a LoRA for {made_for} models ({group[0]}, ...), but the base model is "
            f"{this}; use a {made_for} base model or a LoRA made for {this}"
        )
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
    if all((_prefix_of(name) or "").startswith(TEXT_ENCODER) for name in missing):
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
    text_prefixes: tuple[str, ...] | None = None,
) -> None:
    """Copy a kohya file's down/up weights and alphas into the already-injected adapters.

    ``models`` maps prefix -> adapted model, ``source`` names the file in errors and
    ``text_prefixes`` are the base model family's text-encoder prefixes (to tell a LoRA of
    another family from one whose text encoder is just not trained). Every file
    module must match an adapted layer and every adapted layer must be in the file, with the
    same rank and shapes; a module without alpha gets alpha = rank. Everything is checked
    before anything is copied, so a refused file leaves the adapters as they were.
    """
    models = {prefix.rstrip("_"): unwrap(model) for prefix, model in models.items()}
    table: dict[str, nn.Module] = {}
    for prefix, model in models.items():
        layers = adapter_layers(model)
        for name, path in name_table(prefix, model).items():
            table[name] = layers[path]
    # the file's tensors are the adapters' kind's to group, check and load
    kind = kind_in(models.values())
    groups = kind.group_tensors(tensors, source)
    unmatched = sorted(set(groups) - set(table))
    if unmatched:
        raise CheckpointError(_unmatched_error(unmatched, models, source, text_prefixes))
    missing = sorted(set(table) - set(groups))
    if missing:
        raise CheckpointError(_missing_error(missing, len(table), source))
    kind.load_modules(table, groups, source)


