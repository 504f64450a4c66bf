"""``check --loader comfyui``: which keys of a LoRA file ComfyUI's ``load_lora`` reads for the
model, from the module names it accepts (comfyui_keys.py) and the tensor suffixes it reads under
them (comfy/lora.py, read from Comfy-Org/ComfyUI in 2026); every other key is one ComfyUI logs
as "lora key not loaded". Written from those facts, no ComfyUI code."""

from __future__ import annotations

import torch

from library.lora_tools.comfyui_keys import comfy_key_map
from library.lora_tools.file_modules import FileModules, unknown_reason
from library.lora_tools.layouts import DIFFUSERS_HEADER, known_prefix
from library.lora_tools.loader_report import Report

# (up-like suffix, down-like suffix, extra suffixes) of the LoRA key variants load_lora reads,
# in the order it tries them; the name is followed by "." except for the "_lora." variant.
_LORA_VARIANTS = (
    (".lora_up.weight", ".lora_down.weight", (".lora_mid.weight",)),
    ("_lora.up.weight", "_lora.down.weight", ()),
    (".lora_B.weight", ".lora_A.weight", ()),
    (".lora.up.weight", ".lora.down.weight", ()),
    (".lora_B", ".lora_A", ()),
    (".lora_linear_layer.up.weight", ".lora_linear_layer.down.weight", ()),
    (".lora_B.default.weight", ".lora_A.default.weight", ()),
)
_LOHA = (".hada_w1_a", ".hada_w1_b", ".hada_w2_a", ".hada_w2_b")
_LOKR = (".lokr_w1", ".lokr_w2", ".lokr_w1_a", ".lokr_w1_b", ".lokr_w2_a", ".lokr_w2_b", ".lokr_t2")
_GLORA = (".a1.weight", ".a2.weight", ".b1.weight", ".b2.weight")
_ALWAYS = (".alpha", ".dora_scale", ".diff", ".diff_b", ".set_weight", ".reshape_weight")


def check_comfyui(found: FileModules, tensors, metadata, components, table, source) -> Report:
    """Which keys ComfyUI's load_lora reads for this model (a reproduction, see the module)."""
    report = Report("comfyui")
    key_map = comfy_key_map(components, table)
    by_name: dict[str, set[str]] = {}
    for key in tensors:
        for name in _comfy_names(key, key_map):
            by_name.setdefault(name, set()).add(key)
    loaded: set[str] = set()
    for name, keys in by_name.items():
        consumed, problem = _comfy_load(name, keys, tensors, key_map[name])
        if problem:
            report.drop(consumed, problem)
        loaded |= consumed
    reason = unknown_reason(found, metadata, components)
    ours = {key: name for name, keys in found.keys.items() for key in keys}
    for key in tensors:
        if key in loaded or key in report.dropped:
            continue
        if known_prefix(key, key_map) is not None:
            report.drop([key], "ComfyUI reads no tensor of this name under a known module")
        elif key in ours:
            report.drop(
                [key],
                f"ComfyUI has no module of this name for the layer ({ours[key]}); it does not "
                "read this naming of it (convert the file --to comfyui)",
            )
        else:
            report.drop([key], f"ComfyUI has no such module: {reason}")
    peft = any(key.endswith((".lora_A.weight", ".lora_B.weight")) for key in tensors)
    no_alpha = not any(key.endswith(".alpha") for key in tensors)
    if peft and no_alpha and DIFFUSERS_HEADER in metadata:
        report.notes.append(
            "ComfyUI ignores the lora_adapter_metadata header: it applies every module at "
            "alpha = rank (write the file with convert --fold_alpha for ComfyUI)"
        )
    return report


def _comfy_names(key: str, key_map) -> list[str]:
    """The accepted module names ``key`` is a tensor of (it is ``name`` + a known suffix)."""
    suffixes = [s for variant in _LORA_VARIANTS for s in (variant[0], variant[1], *variant[2])]
    suffixes += [*_LOHA, ".hada_t1", ".hada_t2", *_LOKR, *_GLORA, *_ALWAYS]
    suffixes += [".w_norm", ".b_norm", ".oft_blocks", ".rescale"]
    return [key[: -len(s)] for s in suffixes if key.endswith(s) and key[: -len(s)] in key_map]


def _comfy_load(name: str, keys: set[str], tensors, target) -> tuple[set[str], str | None]:
    """(keys load_lora marks loaded for module ``name``, why they are not applied or None)."""
    consumed = {name + s for s in (".alpha", ".dora_scale") if name + s in keys}
    problem = None
    for up_suffix, down_suffix, extra in _LORA_VARIANTS:
        up_key, down_key = name + up_suffix, name + down_suffix
        if up_key not in keys:
            continue
        consumed.add(up_key)
        if down_key not in tensors:
            return consumed, f"ComfyUI fails on it: {down_key} is missing"
        consumed.add(down_key)
        consumed |= {name + s for s in extra if name + s in keys}
        problem = _comfy_shape(tensors[up_key], tensors[down_key], target)
        break
    if name + ".hada_w1_a" in keys:
        consumed |= {name + s for s in (*_LOHA, ".hada_t1", ".hada_t2") if name + s in keys}
    if any(name + s in keys for s in (".lokr_w1", ".lokr_w2", ".lokr_w1_a", ".lokr_w2_a")):
        consumed |= {name + s for s in _LOKR if name + s in keys}
    if name + ".a1.weight" in keys:
        consumed |= {name + s for s in _GLORA if name + s in keys}
    if name + ".oft_blocks" in keys:
        consumed |= {name + s for s in (".oft_blocks", ".rescale") if name + s in keys}
    if name + ".w_norm" in keys:
        consumed |= {name + s for s in (".w_norm", ".b_norm") if name + s in keys}
    consumed |= {name + s for s in (".diff", ".diff_b", ".set_weight") if name + s in keys}
    return consumed, problem


def _comfy_shape(up: torch.Tensor, down: torch.Tensor, target) -> str | None:
    """Why ComfyUI cannot reshape up @ down to the weight it patches (None when it can)."""
    layer, parts = target
    rows = layer.rows
    out = sum(rows) if parts is None else sum(rows[i] for i in parts)
    shape = (out, *layer.shape[1:])
    ok = up.shape[0] * down.reshape(down.shape[0], -1).shape[1] == torch.Size(shape).numel()
    if not ok or up.reshape(up.shape[0], -1).shape[1] != down.shape[0]:
        return (
            f"ComfyUI logs an error and skips it: up {list(up.shape)} @ down {list(down.shape)} "
            f"does not make the weight's shape {list(shape)}"
        )
    return None
