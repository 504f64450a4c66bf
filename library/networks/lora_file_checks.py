"""What a ``network_weights`` file must be before any of it is loaded: finite, made for the
base model's family, and of the run's adapter kind.

A LoRA holding NaN or infinite values would train from the first step on a NaN loss, and the
message would blame the learning rate. A LoRA of another family would fail on its first module
with a message about layers; by its module names (kohya's names differ between SD 1.x/2.x,
SDXL, FLUX.1 and SD3) or by the ``ss_base_model_version`` its trainer wrote (Chroma's files
have FLUX.1's names) it is named as what it is. A LyCORIS file (LoHa, LoKr) in a LoRA run, or
one of another algorithm in a LyCORIS run, is named with the settings that read it.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from library.data.content_hash import all_finite
from library.errors import CheckpointError
from library.models.families.registry import (
    claim_order,
    entry_of,
    families,
    text_prefix_line,
    text_prefix_lines,
)
from library.networks.kohya_names import TEXT_ENCODER, UNET, prefix_of
from library.networks.lycoris.file_math import ALGO_KEYS, ALGO_LABELS


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


def check_text_prefixes(
    tensors: Mapping[str, torch.Tensor], source: str, text_prefixes: tuple[str, ...] | None
) -> None:
    """CheckpointError naming ``source`` when the file has kohya text-encoder modules under a
    prefix that is not one of the base model family's ``text_prefixes`` (its key map's; None:
    its files do not name text encoders kohya's way): another family's text encoder, which no
    setting makes this model load (a prefix of its own whose encoder does not train is the
    key map's to explain)."""
    if text_prefixes is None:
        return
    for name in sorted({key.split(".")[0] for key in tensors}):
        prefix = prefix_of(name)
        if prefix is None or prefix == UNET or prefix in text_prefixes:
            continue
        made_for = " or ".join(text_prefix_lines(prefix))
        this = text_prefix_line(tuple(text_prefixes)) or "another family"
        raise CheckpointError(
            f"{source}: is a LoRA for {made_for} models ({name}, ...), but the base model is "
            f"{this}; use a {made_for} base model or a LoRA made for {this}"
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


def model_line(family) -> str | None:
    """The model line of a loaded family ("SD 1.x/2.x", "SDXL", "FLUX.1", "Chroma", ...): what
    a LoRA file's ``ss_base_model_version`` tells apart; None for an unregistered family."""
    try:
        entry = entry_of(family)
    except LookupError:
        return None
    return entry.tool.line_of(family) if entry.tool.line_of else entry.lines[0]


def version_line(metadata: Mapping[str, str] | None) -> str | None:
    """The model line a LoRA file's ``ss_base_model_version`` names (kohya's and musubi-
    tuner's values: "sd_v1", "sdxl_base_v1-0", "flux1", "chroma", "qwen_image", ...); None when
    it names none."""
    version = (metadata or {}).get("ss_base_model_version", "").lower()
    marks = [mark for entry in claim_order() for mark in entry.tool.version_marks]
    # the longest mark that fits: "flux2_klein" is FLUX.2's ("flux2"), not FLUX.1's ("flux")
    fits = [(mark, line) for mark, line in marks if version.startswith(mark)]
    return max(fits, key=lambda fit: len(fit[0]))[1] if fits else None


def check_made_for(family, metadata: Mapping[str, str] | None, source: str) -> None:
    """CheckpointError naming ``source`` when the file's ``ss_base_model_version`` names
    another model line than the base model's (a Chroma LoRA on FLUX.1, whose module names are
    the same)."""
    made_for, this = version_line(metadata), model_line(family)
    if made_for is not None and this is not None and made_for != this:
        version = (metadata or {})["ss_base_model_version"]
        raise CheckpointError(
            f"network_weights: {source} is a LoRA for {made_for} models (its "
            f"ss_base_model_version is {version!r}), but the base model is {this}; use a "
            f"{made_for} base model or a LoRA made for {this}"
        )


def file_algorithm(tensors: Mapping[str, torch.Tensor]) -> str | None:
    """The LyCORIS algorithm of a file's modules: "loha" or "lokr" when it holds their
    tensors (the first found), "locon" for LoRA/LoCon ones (kohya's lora_down), else None."""
    found = None
    for key in tensors:
        for algo in ("loha", "lokr", "locon"):
            if key.endswith(tuple(f".{suffix}" for suffix in ALGO_KEYS[algo])):
                if algo != "locon":
                    return algo
                found = algo
    return found


def check_adapter_kind(
    tensors: Mapping[str, torch.Tensor], kind: str, algo: str | None, source: str
) -> None:
    """CheckpointError naming ``source`` and the settings that read it when the file's
    modules are not the run's adapters: LoHa or LoKr in a LoRA run (``kind`` "lora"), or in a
    LyCORIS run (``kind`` "lycoris") another algorithm than the run's ``algo``."""
    found = file_algorithm(tensors)
    if found is None or (kind == "lora" and found == "locon"):
        return
    if kind == "lora":
        raise CheckpointError(
            f"network_weights: {source} is a LyCORIS {ALGO_LABELS[found]} file and this run "
            f'trains LoRA adapters; set network_module = "lycoris.kohya" and network_args = '
            f'["algo={found}"] (with the preset, dim and factor it was trained with) to train '
            "on from it"
        )
    if kind == "lycoris" and algo is not None and found != algo:
        raise CheckpointError(
            f"network_weights: {source} is a LyCORIS {ALGO_LABELS[found]} file and this run "
            f'trains LyCORIS {ALGO_LABELS[algo]}; set network_args "algo={found}" to train on '
            "from it"
        )
