"""kohya's LoRA naming, the part every adapter kind's file code shares: the prefixes, the
tensor names of a LoRA module, and the module path a model's layer is named by (see
library/networks/kohya_keys.py for reading and writing whole files)."""

from __future__ import annotations

from collections.abc import Callable, Mapping

import torch
from diffusers import UNet2DConditionModel
from torch import nn
from transformers import CLIPTextModel

from library.models.original_names import unet_path_to_original

UNET = "lora_unet"
TEXT_ENCODER = "lora_te"
# Every prefix a kohya SD/SDXL/FLUX.1 text-encoder or UNet name may use: what it adapts, and how
# to load such weights (the fused transformer names of FLUX.1 and SD3 are read by
# library/networks/fused_keys.py with the tables of the families' flux/lora_keys.py and
# sd3/lora_keys.py).
KNOWN_PREFIXES = {
    "lora_unet": ("UNet", "set network_train_text_encoder_only = false"),
    "lora_te": ("text encoder", "set network_train_unet_only = false"),
    "lora_te1": (
        "first SDXL text encoder",
        "set network_train_unet_only = false if the base model is SDXL (an SDXL LoRA needs an "
        "SDXL base model)",
    ),
    "lora_te2": (
        "second SDXL text encoder",
        "set network_train_unet_only = false if the base model is SDXL (an SDXL LoRA needs an "
        "SDXL base model)",
    ),
    "lora_te3": (
        "FLUX.1's T5-XXL text encoder",
        'set network_train_unet_only = false and network_args = ["train_t5xxl=True"] if the '
        "base model is FLUX.1",
    ),
}
DOWN, UP, ALPHA = "lora_down.weight", "lora_up.weight", "alpha"


def prefix_of(name: str) -> str | None:
    """The longest known kohya prefix ``name`` starts with (lora_te1 before lora_te)."""
    for prefix in sorted(KNOWN_PREFIXES, key=len, reverse=True):
        if name.startswith(prefix + "_"):
            return prefix
    return None


def kohya_name(prefix: str, module_path: str) -> str:
    """``kohya_name("lora_unet", "mid_block.attentions.0.proj_in")`` -> ``lora_unet_mid_block_...``."""
    return f"{prefix.rstrip('_')}_{module_path.replace('.', '_')}"


# How kohya's files name the modules of a UNet with a given config: "original" (the SGM layout,
# SDXL's) or "diffusers". The family's answer (its entry's ``lora_files.unet_key_layout``), which
# callers hand in: this module sits below the families and does not ask the registry.
UNetKeyLayout = Callable[[Mapping], str]


def kohya_path(
    model: nn.Module, path: str, unet_key_layout: UNetKeyLayout | None = None
) -> str:
    """The module path kohya names ``path`` by.

    kohya's names follow transformers 4's CLIPTextModel, whose layers sit under ``text_model``;
    transformers 5 flattened that attribute away, so the prefix is put back for the file. A UNet
    whose family names LoRA modules in the original layout (``unet_key_layout`` says so of its
    config: SDXL's) gets its SGM path.
    """
    if isinstance(model, CLIPTextModel) and not hasattr(model, "text_model"):
        return f"text_model.{path}"
    if (
        unet_key_layout is not None
        and isinstance(model, UNet2DConditionModel)
        and unet_key_layout(model.config) == "original"
    ):
        return unet_path_to_original(path, model.config)
    return path


def unwrap(model: nn.Module) -> nn.Module:
    """The model inside DDP/DataParallel or torch.compile wrappers, whose paths kohya names."""
    while True:
        if isinstance(model, (nn.parallel.DistributedDataParallel, nn.DataParallel)):
            model = model.module
        elif isinstance(getattr(model, "_orig_mod", None), nn.Module):
            model = model._orig_mod
        else:
            return model


def group_modules(tensors: Mapping[str, torch.Tensor]) -> dict[str, dict[str, torch.Tensor]]:
    """module name -> {suffix: tensor} for keys ``<name>.<suffix>``, whatever the suffixes
    (``lora_unet_x.lora_down.weight`` -> ``{"lora_unet_x": {"lora_down.weight": ...}}``)."""
    groups: dict[str, dict[str, torch.Tensor]] = {}
    for key, tensor in tensors.items():
        name, _, suffix = key.partition(".")
        groups.setdefault(name, {})[suffix] = tensor
    return groups
