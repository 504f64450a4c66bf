"""What the family conformance suite (tests/conformance/) needs of a family: its test kit.

A family joins the suite by defining a ``ConformanceKit`` in its package (``<family>/testkit.py``,
``KIT``) and naming it in its registry entry (``test_kit=Deferred("...testkit:KIT").get``). The
suite then checks, for every registered family with a kit, the properties every family must
have (name tables against diffusers' converters, folders against diffusers' pipelines, single
files against the folder, LoRA and LyCORIS files round trip and load in diffusers, LoRA files
merged by lora_tool against peft's merge, samples against diffusers' pipelines, the training
loss against a plain reference) against references outside the family's code. The kit builds
tiny models (as modules, a diffusers folder and single files) and names diffusers' own
readers; the only expectations it computes are its plain reference losses
(``loss_reference``): the family's objective facts written out on diffusers' pipeline modules
(their text encoding and conditioning), independently of the family's training code.
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
class SampleCase:
    """One prompt sampled by us (``sample_images`` on the folder as our loader reads it) and by
    diffusers' pipeline on the same folder.

    ``prompt``: SamplePrompt fields over the suite's. ``call``: the pipeline call's arguments for
    the same sample besides prompt, size, steps and generator (guidance, negative prompt, text
    length). ``model`` / ``flow``: ModelSection / FlowSection keys our loader reads the folder
    with. ``pipeline_keys``: from_pretrained arguments of the pipeline (or a function of the
    folder giving them, e.g. a tokenizer as released where the tiny folder's differs). ``scheduler(folder)``:
    the pipeline's scheduler, as released (None: the folder's, as diffusers reads it).
    ``differs``: call overrides (a "scheduler" key: such a function) that each give another
    image, so the comparison pins what they change. ``tolerance``: the largest pixel difference
    (1: one level of rounding)."""

    prompt: Mapping[str, Any] = field(default_factory=dict)
    call: Mapping[str, Any] = field(default_factory=dict)
    model: Mapping[str, Any] = field(default_factory=dict)
    flow: Mapping[str, Any] = field(default_factory=dict)
    pipeline_keys: Mapping[str, Any] | Callable[[Path], Mapping[str, Any]] = field(
        default_factory=dict
    )
    scheduler: Callable[[Path], Any] | None = None
    differs: tuple[Mapping[str, Any], ...] = ()
    tolerance: int = 1


@dataclass(frozen=True, kw_only=True)
class LossCase:
    """One training configuration of the loss property: ModelSection, FlowSection and
    TrainingSection keys (``model``, ``flow``, ``training``) our loader and step read."""

    model: Mapping[str, Any] = field(default_factory=dict)
    flow: Mapping[str, Any] = field(default_factory=dict)
    training: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, kw_only=True)
class ConformanceKit:
    """A family's tiny models and the diffusers readers they are checked against.

    ``variants``: the family's variants as tiny models (the first is the one the costlier checks
    use). ``build(variant, seed)``: its modules by diffusers pipeline component name
    ("transformer" or "unet", "vae", "text_encoder", "text_encoder_2", ...).
    ``write_folder(path, variant, seed)``: the same modules as a diffusers folder, which
    diffusers reads as the pipeline class ``pipeline(variant)`` names.
    ``write_single_files(path, variant, seed)``: the same modules as the single files users
    have (the original-layout checkpoint, or the family's separate component files, with
    tokenizer folders), written in float32 under ``path``; returns the ModelSection and
    FlowSection keys that load them (``pretrained_model_name_or_path`` and the rest).
    ``family(variant, modules)``: the ModelFamily instance of those modules.
    ``denoiser_names`` / ``vae_names``: the name tables of a family whose single files use the
    original layout. ``denoiser_inputs(denoiser, seed)``: keyword arguments of one forward
    call. ``lora_conv``: its default LoRA also adapts convolutions (LoCon).
    ``diffusers_lora_skips(path)``: denoiser layers diffusers' LoRA loader cannot read at the
    tiny models' width (left out of that check only).
    ``sample_cases(variant)``: prompts whose samples must equal diffusers' pipeline's
    (SampleCase). ``loss_cases(variant)`` and ``loss_reference(pipe, batch, seed, case)``: the
    configurations whose micro-batch loss must equal the plain reference, written from the
    family's objective facts on the modules of diffusers' pipeline ``pipe`` (conditioned as the
    pipeline conditions them) with the trainer's keyed draws (library.training.noise.draw) for
    ``seed``; ``batch`` is as the data loader gives it (captions, pixels, loss weights,
    positions, epoch, and each image's original size, crop top-left and bucket size).
    ``skips``: property -> why it does not apply to the family, said when the suite skips it
    ("denoiser_names", "vae_names": no table of the family's own; "single_files": the family
    has no single-file form; "merge": lora_tool.py cannot merge its LoRA files into the model;
    "lycoris_fused": its LyCORIS files name no fused original layer; "lycoris": it trains no
    LyCORIS; "sample", "loss": no case or reference for the variant); a property without one
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
    write_single_files: (
        Callable[[Path, str, int], tuple[Mapping[str, Any], Mapping[str, Any]]] | None
    ) = None
    sample_cases: Callable[[str], tuple[SampleCase, ...]] | None = None
    loss_cases: Callable[[str], tuple[LossCase, ...]] | None = None
    loss_reference: Callable[[Any, Mapping[str, Any], int, LossCase], torch.Tensor] | None = None
    skips: Mapping[str, str] = field(default_factory=dict)

    def skip_reason(self, prop: str, default: str) -> str:
        """Why ``prop`` is skipped for this family: the kit's reason, else ``default``."""
        return self.skips.get(prop, default)

    @property
    def variant(self) -> str:
        """The variant the costlier checks use."""
        return self.variants[0]
