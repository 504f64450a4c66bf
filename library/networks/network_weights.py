"""``network_weights``: what the trainer does with a LoRA file it starts from, in one place, so
that ``lora_tool.py check`` asks the very same code what the trainer reads (and what it refuses,
with the trainer's own reason) instead of keeping its own idea of each family's layouts.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path

import torch
from torch import nn

from library.errors import CheckpointError
from library.networks.key_maps import text_prefixes
from library.networks.kinds import kind_in
from library.networks.kohya_names import ALPHA, DOWN
from library.networks.linear_files import PEFT_DOWN
from library.networks.lora_file_checks import (
    check_adapter_kind,
    check_lora_file,
    check_made_for,
    check_text_prefixes,
    lora_family,
    model_line,
)
from library.networks.peft_metadata import peft_configs
from library.saving.lora_file import check_lora_keys, read_lora_file

log = logging.getLogger(__name__)


def reads_diffusers_layout(family) -> bool:
    """The trainer takes files holding only diffusers' peft keys (lora_A / lora_B) for this
    family: those whose LoRA files can be written in that layout (``lora_formats``), and those
    whose key map reads other tools' layouts, peft's among them."""
    return "diffusers" in family.lora_formats or family.adapter_key_map().reads_peft


def read_network_file(family, path: str | Path) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """The tensors and header of the file ``path`` (CheckpointError for a file the trainer does
    not read)."""
    return read_lora_file(path, reads_diffusers_layout(family))


def read_network_weights(family, path: str | Path) -> dict[str, torch.Tensor]:
    """The tensors of the file ``path`` (CheckpointError for a file the trainer does not read)."""
    return read_network_file(family, path)[0]


def import_network_weights(
    family, models: Mapping[str, nn.Module], tensors: Mapping[str, torch.Tensor], source,
    metadata: Mapping[str, str] | None = None,
) -> None:  # fmt: skip
    """Load a file's ``tensors`` into the adapters of ``models`` (kohya prefix -> model) as
    network_weights does: its keys must be a layout the trainer reads, its numbers finite, its
    module names and ``ss_base_model_version`` the base model's line's and its modules the
    run's adapter kind; alphas of 0 are read as rank (:func:`zero_alphas_as_rank`); then the
    family's key map reads it (``family.load_lora_tensors``; ``metadata``: the file's header,
    where peft files keep their alpha). CheckpointError naming ``source`` otherwise (naming
    the line the file's module names are, when the model cannot take them)."""
    check_lora_keys(tensors, source, reads_diffusers_layout(family))
    check_lora_file(tensors, str(source), family.modelspec_architecture)
    check_made_for(family, metadata, str(source))
    kind = kind_in(models.values())
    check_adapter_kind(tensors, kind.name, _lycoris_algo(kind, models), str(source))
    tensors = zero_alphas_as_rank(tensors, metadata, source, reads_diffusers_layout(family))
    try:
        check_text_prefixes(tensors, str(source), text_prefixes(family.adapter_key_map()))
        family.load_lora_tensors(models, tensors, str(source), metadata)
    except CheckpointError as exc:
        raise CheckpointError(f"{exc}{_names_hint(family, tensors)}") from None


def _lycoris_algo(kind, models: Mapping[str, nn.Module]) -> str | None:
    """The one LyCORIS algorithm ("locon", "loha", "lokr") of the adapters of ``models``;
    None for LoRA adapters."""
    algos = {
        getattr(layer, "algo", None) for m in models.values() for layer in kind.layers(m).values()
    }
    return next(iter(algos)) if len(algos) == 1 else None


def _names_hint(family, tensors: Mapping[str, torch.Tensor]) -> str:
    """For a file the base model does not take: "; its module names are <line>'s ..." when
    its names are another model line's (a FLUX.1 LoRA with modulation modules on Chroma,
    whose other names are FLUX.1's), else nothing."""
    made_for, example = lora_family(tensors)
    this = model_line(family)
    if made_for is None or this is None or made_for == this:
        return ""
    return (
        f"; its module names ({example}, ...) are {made_for}'s: a LoRA for {made_for} models, "
        f"which a {this} model cannot take; use a LoRA made for {this}"
    )


def zero_alphas_as_rank(
    tensors: Mapping[str, torch.Tensor], metadata: Mapping[str, str] | None, source, peft: bool
) -> Mapping[str, torch.Tensor]:
    """``tensors`` with every LoRA module's alpha of 0 made its rank, with one warning naming
    ``source`` when there are any (``peft``: the family reads diffusers' header, whose
    lora_alpha of 0 peft_metadata reads as rank).

    kohya's networks (sd-scripts' LoRAModule, LyCORIS' modules) take alpha 0 as alpha = rank,
    scale 1, and save that alpha; read literally it is scale 0, a run that changes nothing."""
    zero = [
        k for k, t in tensors.items() if k.endswith("." + ALPHA) and t.numel() == 1 and not t.any()
    ]
    fields = []
    if peft:
        fields = [
            f for config in peft_configs(metadata, source).values() for f in config.zero_fields
        ]
    if not zero and not fields:
        return tensors
    read = dict(tensors)
    for key in zero:
        name = key[: -len(ALPHA) - 1]
        down = tensors.get(f"{name}.{DOWN}", tensors.get(f"{name}.{PEFT_DOWN}"))
        if down is not None:  # LoHa and LoKr modules read alpha 0 as rank themselves
            read[key] = torch.tensor(float(down.shape[0]), dtype=torch.float32)
    where = [f"{len(zero)} alpha tensors ({zero[0]}, ...)" if zero else "", *fields]
    log.warning(
        "network_weights: %s has alpha 0 in %s; read as kohya's networks read it, alpha = rank "
        "(scale 1), and saved so",
        source, ", ".join(w for w in where if w),
    )  # fmt: skip
    return read
