"""A LoRA file's keys sorted by the model's layers, whatever the file's layout: what ``check``
compares with what each loader does."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from library.errors import CheckpointError
from library.lora_tools.base_model import family_label, other_family
from library.lora_tools.comfyui_keys import comfy_names
from library.lora_tools.layouts import detect_layout, diffusers_names, split_keys
from library.lora_tools.loader_report import Report
from library.lora_tools.to_kohya import to_kohya
from library.networks.kohya_names import group_modules


@dataclass
class FileModules:
    """A file's keys sorted by the model's layers (kohya names), whatever its layout."""

    layout: str
    modules: dict[str, dict[str, torch.Tensor]]  # kohya name -> kohya-layout tensors
    keys: dict[str, list[str]]  # kohya name -> the file's keys of that module
    unknown: list[str]  # file keys that name no layer of the model
    malformed: dict[str, str]  # file key -> why it cannot be read as a module tensor


def sort_keys(tensors, metadata, components, table, source) -> FileModules:
    """The file's keys sorted by module (see FileModules)."""
    layout = detect_layout(tensors, source)
    if layout == "kohya":
        groups = group_modules(tensors)
        known = {n: p for n, p in groups.items() if n in table}
        keys = {n: [f"{n}.{s}" for s in groups[n]] for n in known}
        unknown = sorted(f"{n}.{s}" for n, p in groups.items() if n not in table for s in p)
        return FileModules(layout, known, keys, unknown, {})
    if layout == "comfyui":
        names = comfy_names(table, components)
    else:
        names = {key: name for key, (name, _) in diffusers_names(table, components).items()}
    found, unknown = split_keys(tensors, names)
    by_module: dict[str, list[str]] = {}
    for prefix, by_suffix in found.items():
        by_module.setdefault(names[prefix], []).extend(by_suffix.values())
    modules, malformed = {}, {}
    for keys in by_module.values():
        try:
            kohya, _ = to_kohya({k: tensors[k] for k in keys}, metadata, components, table, source)
        except CheckpointError as exc:
            malformed.update(dict.fromkeys(keys, str(exc).removeprefix(f"{source}: ")))
            continue
        modules.update(group_modules(kohya))
    keys_of = {name: keys for name, keys in by_module.items() if name in modules}
    return FileModules(layout, modules, keys_of, sorted(unknown), malformed)


def unknown_reason(found: FileModules, metadata, components) -> str:
    """Why a loader drops the file's keys that name no layer of the model."""
    label = family_label(components.family)
    names = [key.split(".", 1)[0] for key in found.unknown]
    guess = other_family(names, metadata, components.family)
    if guess is not None:
        return f"names no layer of this {label} model: the file is a LoRA for {guess} models"
    return f"names no layer of this {label} model (a file for another model?)"


def report_unreadable(report: Report, found: FileModules, metadata, components) -> None:
    """Drop in ``report`` the file's keys that name no layer of the model, and those that cannot
    be read as a module's tensors, each with its reason."""
    report.drop(found.unknown, unknown_reason(found, metadata, components))
    for key, reason in found.malformed.items():
        report.drop([key], reason)
