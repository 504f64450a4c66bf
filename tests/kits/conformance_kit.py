"""What the family conformance suite (tests/conformance/) needs of a family: its test kit.

A family joins the suite by defining a ``ConformanceKit``, ``KIT`` in
tests/kits/<family name>/kit.py, which ``tests.kits.kit_of`` finds by the family's name. The
suite then checks, for every registered family with a kit, the properties every family must
have (name tables against diffusers' converters, folders against diffusers' pipelines, single
files against the folder, LoRA and LyCORIS files round trip and load in diffusers, LoRA files
merged by lora_tool against peft's merge, samples against diffusers' pipelines, the training
loss against a plain reference) against references outside the family's code. The kit builds
tiny models (as modules, a diffusers folder and single files) and names diffusers' own
readers; the only expectations it computes are its plain reference losses
(``loss_reference``): the family's objective facts written out on diffusers' pipeline modules
(their text encoding and conditioning), independently of the family's training code.

The kit also declares the family's distributed equivalence modes (``distributed``, each a
``DistributedMode``), which tests/distributed/suite.py builds from the registry: a family gets
its 2-process proofs (the same weights as one process, resumed and sharded where it says so)
from its own kit.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

    from library.models.families.base import ModelFamily

State = Mapping[str, "torch.Tensor"]
# Captions of four token lengths, for a distributed mode whose family keeps each caption at its
# own length: alone in a micro-batch each is its own length, in a batch of 4 they are padded to
# the longest with a mask, and both must train the same adapter.
FOUR_LENGTH_CAPTIONS = (
    "red",
    "a photo of shape number 1",
    "a photo of shape number 2 on a gradient, centred in the frame",
    "a much longer caption of shape number three, a coloured square on a soft gradient",
)


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
class DistributedMode:
    """One distributed equivalence mode of a family (tests/distributed/): the same 4 samples,
    trained for 2 optimizer steps as 2 processes x accumulation 2 x batch 1 (torchrun), as
    1 x 4 x 1 and as 1 x 1 x 4 (one process), must write the same weights.

    ``name``: the mode, unique among every family's and the suite's own ("flux-lora"); its runs
    are ``eq-<name>-<layout>``. ``keys``: config keys of every layout, over the suite's (2 steps,
    Adam's eps 1e-3, the family's tiny folder). ``ddp_options``: command-line options of the
    2-process run only, a DDP-side setting ("--gradient_checkpointing",
    "--ddp_gradient_as_bucket_view") the single-process references run without. ``variant``:
    the kit variant whose tiny folder (ConformanceKit.write_folder, seed 0) the runs train on
    (None: the kit's first). ``captions``: one caption per image of the suite's four, where the
    family needs particular ones (Z-Image: four token lengths); unset: the suite's own.
    ``atol``: the weights' tolerance where the family's float sums differ by more than the
    suite's 1e-6 between layouts (say why beside it). ``holds``: each of these starts the name
    of some tensor of the trained file (a text encoder's adapters); ``only``: every name starts
    with one of these. ``resume``: the runs save a state every step, and the 2-process run
    continued from its step-1 state, on 2 processes and on 1 process x accumulation 4, must end
    on the uninterrupted weights. ``ddp_modules``: for a sharded mode (``keys["fsdp"]``), the
    modules the 2-process run keeps under DDP beside the sharded denoiser (trained text
    encoders). ``references``: each image trains with a reference image (an edit model's), the
    image mirrored at another size, paired from a control folder. ``clips``: the four samples are
    clips (a family that TRAINS_CLIPS): four short mp4 videos of a square moving, one clip of
    ``clips`` frames from the head of each, with the mode's captions. ``samples``: every run
    draws the suite's sample prompts (FSDP_PROMPTS) before its first step, which the layouts
    must draw alike.

    A family's first mode is its own proof: it is also trained as 1 x 2 x 1 (2 samples a step
    instead of 4), which must give other weights, so the comparison can fail."""

    name: str
    keys: Mapping[str, Any] = field(default_factory=dict)
    ddp_options: tuple[str, ...] = ()
    variant: str | None = None
    captions: tuple[str, ...] = ()
    atol: float | None = None
    holds: tuple[str, ...] = ()
    only: tuple[str, ...] = ()
    resume: bool = False
    ddp_modules: tuple[str, ...] = ()
    references: bool = False
    clips: int = 0
    samples: bool = False

    @property
    def sharded(self) -> bool:
        """The 2-process run shards the denoiser (FSDP2); one process trains it whole."""
        return bool(self.keys.get("fsdp"))

    def sharding(self, name: str, fsdp: str = "full_shard", **changes: Any) -> DistributedMode:
        """This mode with the denoiser sharded as ``fsdp`` over the 2 processes, as the mode
        ``name``: the same keys, no DDP-side option (the denoiser is not under DDP), no resume
        (the unsharded mode's), ``changes`` over that."""
        keys = {**self.keys, "fsdp": fsdp}
        return replace(self, name=name, keys=keys, ddp_options=(), resume=False, **changes)


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
    ``file_module(variant, module)``: the part of a folder's module its single file holds,
    where that is less (a vision-language text encoder whose file is read as its language
    model alone); unset: the whole module.
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
    ``distributed``: its distributed equivalence modes (DistributedMode), which
    tests/distributed trains as 2 processes and as one and compares; the first is the family's
    own proof.
    ``skips``: property -> why it does not apply to the family, said when the suite skips it
    ("denoiser_names", "vae_names": no table of the family's own; "single_files": the family
    has no single-file form; "merge": lora_tool.py cannot merge its LoRA files into the model;
    "lycoris_fused": its LyCORIS files name no fused original layer; "lycoris": it trains no
    LyCORIS; "sample", "loss": no case or reference for the variant; "distributed": no
    distributed mode, which a kit must otherwise declare); a property without one skips with the
    suite's own reason.
    ``pipeline_keys(folder)``: from_pretrained arguments diffusers needs to read the family's
    folder here (a part it cannot build by itself); unset: none."""

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
    file_module: Callable[[str, torch.nn.Module], torch.nn.Module] | None = None
    sample_cases: Callable[[str], tuple[SampleCase, ...]] | None = None
    loss_cases: Callable[[str], tuple[LossCase, ...]] | None = None
    loss_reference: Callable[[Any, Mapping[str, Any], int, LossCase], torch.Tensor] | None = None
    distributed: tuple[DistributedMode, ...] = ()
    skips: Mapping[str, str] = field(default_factory=dict)
    pipeline_keys: Callable[[Path], Mapping[str, Any]] | None = None

    def skip_reason(self, prop: str, default: str) -> str:
        """Why ``prop`` is skipped for this family: the kit's reason, else ``default``."""
        return self.skips.get(prop, default)

    @property
    def variant(self) -> str:
        """The variant the costlier checks use."""
        return self.variants[0]
