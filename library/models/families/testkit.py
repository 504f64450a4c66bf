"""What the family conformance suite (tests/conformance/) needs of a family: its test kit.

A family joins the suite by defining a ``ConformanceKit`` in its package (``<family>/testkit.py``,
``KIT``) and naming it in its registry entry (``test_kit=Deferred("...testkit:KIT").get``). The
suite then checks, for every registered family with a kit, the properties every family must
have (name tables against diffusers' converters, folders against diffusers' pipelines, LoRA and
LyCORIS files round trip and load in diffusers) against references outside the family's code.
The kit only builds tiny models and names diffusers' own readers; it computes no expectation.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

    from library.models.families.base import ModelFamily

State = Mapping[str, "torch.Tensor"]


@dataclass(frozen=True, kw_only=True)
class NameTable:
    """A module's diffusers <-> original names. ``to_original(state, config)`` and
    ``from_original(original, config)`` are the family's own; ``reference(original, config)``
    is diffusers' single-file converter on the original layout (the expectation)."""

    to_original: Callable[[State, Mapping[str, Any]], dict]
    from_original: Callable[[State, Mapping[str, Any]], dict]
    reference: Callable[[State, Mapping[str, Any]], dict]


@dataclass(frozen=True, kw_only=True)
class ConformanceKit:
    """A family's tiny models and the diffusers readers they are checked against.

    ``variants``: the family's variants as tiny models (the first is the one the costlier checks
    use). ``build(variant, seed)``: its modules by diffusers pipeline component name
    ("transformer" or "unet", "vae", "text_encoder", "text_encoder_2", ...).
    ``write_folder(path, variant, seed)``: the same modules as a diffusers folder, which
    diffusers reads as the pipeline class ``pipeline(variant)`` names. ``family(variant, modules)``: the
    ModelFamily instance of those modules. ``denoiser_names`` / ``vae_names``: the name tables
    of a family whose single files use the original layout. ``denoiser_inputs(denoiser,
    seed)``: keyword arguments of one forward call. ``lora_conv``: its default LoRA also adapts
    convolutions (LoCon). ``diffusers_lora_skips(path)``: denoiser layers diffusers' LoRA
    loader cannot read at the tiny models' width (left out of that check only).
    ``skips``: property -> why it does not apply to the family, said when the suite skips it
    ("denoiser_names", "vae_names": no table of the family's own; "lycoris_fused": its LyCORIS
    files name no fused original layer; "lycoris": it trains no LyCORIS); a property without one
    skips with the suite's own reason."""

    variants: tuple[str, ...]
    build: Callable[[str, int], dict]
    write_folder: Callable[[Path, str, int], Path]
    pipeline: Callable[[str], str]
    family: Callable[[str, Mapping[str, Any]], ModelFamily]
    denoiser_inputs: Callable[[Any, int], dict]
    denoiser_names: NameTable | None = None
    vae_names: NameTable | None = None
    lora_conv: bool = False
    diffusers_lora_skips: Callable[[str], bool] | None = None
    skips: Mapping[str, str] = field(default_factory=dict)

    def skip_reason(self, prop: str, default: str) -> str:
        """Why ``prop`` is skipped for this family: the kit's reason, else ``default``."""
        return self.skips.get(prop, default)

    @property
    def variant(self) -> str:
        """The variant the costlier checks use."""
        return self.variants[0]
