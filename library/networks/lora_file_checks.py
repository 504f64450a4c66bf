"""What a ``network_weights`` file must be before any of it is loaded: finite, and made for the
base model's family.

A LoRA holding NaN or infinite values would train from the first step on a NaN loss, and the
message would blame the learning rate. A LoRA of another family would fail on its first module
with a message about layers; by its module names (kohya's names differ between SD 1.x/2.x,
SDXL, FLUX.1 and SD3) it is named as what it is.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from library.data.content_hash import all_finite
from library.errors import CheckpointError
from library.models.families.registry import families, text_prefix_line
from library.networks.kohya_names import TEXT_ENCODER


def check_lora_file(tensors: Mapping[str, torch.Tensor], source: str, architecture: str) -> None:
    """CheckpointError naming ``source`` when a tensor is not finite, or when the file's module
    names are another family's than the base model's (its modelspec ``architecture``)."""
    broken = [k for k, t in tensors.items() if not all_finite(t)]
    if broken:
        more = f" and {len(broken) - 1} more" if len(broken) > 1 else ""
        raise CheckpointError(
            f"network_weights: {source} holds NaN or infinite values ({broken[0]}{more}); the "
            "file is damaged (or was saved from a run that diverged): use an earlier save of it"
        )
    made_for, example = lora_family(tensors)
    architectures = [mark for entry in families() for mark in entry.lora_files.architectures]
    this = next((line for start, line in architectures if architecture.startswith(start)), None)
    if made_for is not None and this is not None and made_for != this:
        raise CheckpointError(
            f"network_weights: {source} is a LoRA for {made_for} models ({example}, ...), but "
            f"the base model is {this}; use a {made_for} base model or a LoRA made for {this}"
        )


def lora_family(tensors: Mapping[str, torch.Tensor]) -> tuple[str | None, str]:
    """(the model line whose denoiser a LoRA file's module names belong to, one such key); for
    a file without denoiser modules, the line whose only text-encoder prefix is kohya's lora_te
    (SD 1.x/2.x: one unnumbered text encoder) when it has lora_te_ names; None when the names
    do not tell."""
    keys = sorted(tensors)
    marks = [mark for entry in families() for mark in entry.lora_files.denoiser_marks]
    for key in keys:
        for start, line in marks:
            if key.startswith(start):
                return line, key.split(".")[0] if key.startswith("lora_") else key
    text = next((k for k in keys if k.startswith(TEXT_ENCODER + "_")), None)
    return (text_prefix_line((TEXT_ENCODER,)), text.split(".")[0]) if text else (None, "")
