"""What shared code may ask of a model family before, and without, loading it: its entry.

An entry is data and a few functions: the family's names in messages, its loader, the config
keys and kohya vocabulary it owns, and what the toolbox (lora_tool.py) needs to label its models
and name their layers. Each family package defines its entry (``sd.entry``, ``flux.entry``,
...) and library.models.families.registry lists them; shared modules ask the registry.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from library.config.flow_section import FlowSection
from library.config.model_schema import ModelSection
from library.config.section import Section
from library.config.unsupported import Unsupported
from library.models.families import edit_variant
from library.models.families.edit_variant import EditVariant, ReferenceCounts


class LoadedFamily(Protocol):
    """A loaded family (a ModelFamily instance, library.models.families.base) as entries and the
    registry see it: they read without torch, which the family class imports."""

    name: str



# kohya's LoRA module, which trains every family (a family's own module is its entry's).
GENERIC_LORA_MODULE = "networks.lora"


@dataclass(frozen=True)
class Deferred:
    """A function or class of a family module, imported on first use: ``"package.module:name"``.

    Entries name their loaders this way so that listing the families (the registry) loads none
    of their code, nor diffusers, for a config check. The named code sits below the registry
    (tests/test_import_layering.py: no Deferred name closes an import cycle). A
    family's pipeline folder (folder_loader.FolderPart) names the diffusers and transformers
    classes reading its parts this way too, so declaring the folder loads neither."""

    target: str

    def get(self) -> Any:
        """The object ``target`` names."""
        module, name = self.target.split(":")
        return getattr(importlib.import_module(module), name)

    def __call__(self, *args: object) -> Any:
        return self.get()(*args)


@dataclass(frozen=True, kw_only=True)
class KohyaVocabulary:
    """What sd-scripts' scripts and network module for the family call their options.

    ``options``: options of its sd-scripts scripts that difftune does not implement (known by
    name, accepted at their off value). ``network_args``: arguments of its kohya network module
    difftune reads (they are [flow] keys). ``off_network_args``: argument -> (values that mean
    off, why another is refused). ``refused_network_args``: argument -> why it is refused.
    ``aliases``: the names its trainers (sd-scripts', musubi-tuner's) give keys difftune has
    under another name (key -> ours), such as musubi-tuner's per-model dataset keys."""

    options: Mapping[str, Unsupported] = field(default_factory=dict)
    network_args: tuple[str, ...] = ()
    off_network_args: Mapping[str, tuple[tuple[object, ...], str]] = field(default_factory=dict)
    refused_network_args: Mapping[str, str] = field(default_factory=dict)
    aliases: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, kw_only=True)
class LoraFiles:
    """How the trainer tells which of the family's lines a LoRA file (network_weights) was made
    for, to refuse another line's file by name.

    ``denoiser_marks``: (start, line) of denoiser module names only that line's files hold
    (kohya's, and diffusers' where other trainers write those). ``text_prefixes``: the kohya
    text-encoder prefixes of a line's files -> the line. ``architectures``: (start of a base
    model's modelspec.architecture, its line). ``unet_key_layout(unet_config)``: how kohya's
    files name the modules of the family's UNet with that config, "original" (the SGM layout,
    library.models.original_names) or "diffusers" (its module paths); unset: no UNet."""

    denoiser_marks: tuple[tuple[str, str], ...] = ()
    text_prefixes: Mapping[tuple[str, ...], str] = field(default_factory=dict)
    architectures: tuple[tuple[str, str], ...] = ()
    unet_key_layout: Callable[[Mapping], str] | None = None


@dataclass(frozen=True, kw_only=True)
class ToolFacts:
    """What lora_tool.py needs to label the family's models and find its layers.

    ``component_options``: [flow] keys of component files its single-file models may need ->
    what the file is (they become the toolbox's --options). ``variant_labels``: a family
    instance's name -> its label ("flux-dev" -> "FLUX.1 dev"). ``line_of``: which of the entry's
    ``lines`` a family instance is (unset: the only one). ``lora_marks``: (kohya module-name
    prefix, line) that mark a LoRA file as made for a line, in the order they decide (a file
    with marks of several lines is the first's); ``version_marks``: (ss_base_model_version
    prefix, line). ``to_original``: the family's ``transformer_to_original``, which names the
    denoiser's weights as the original model does (unset: one layer per name, as a UNet).
    ``comfy_original`` / ``comfy_keys``: the denoiser layer's path in ComfyUI's own layout, and
    the further names ComfyUI's LoRA loader accepts for it (name -> the layer's parts the name
    stands for, None: all), as library.lora_tools.comfyui_keys reproduces them;
    ``comfy_model_name``: the layer's weight in ComfyUI's own model, by which ComfyUI's generic
    names (``lora_unet_<name>``, ``diffusion_model.<name>``) are made, None where that weight
    is fused from several layers (unset: ``comfy_original``'s path).
    ``own_layout``: the toolbox's key layout (library.lora_tools.layouts: "kohya", "diffusers"
    or "comfyui") the family's key map writes its files in; ``layout_names``: a layout -> what
    the family's files in it are, in words for messages (unset: the layout's name alone).
    ``folds_alpha``: its files in ComfyUI's names hold peft's LoRA tensors with alpha / r
    folded into the up factor (its readers take no alpha there)."""

    component_options: Mapping[str, str] = field(default_factory=dict)
    variant_labels: Mapping[str, str] = field(default_factory=dict)
    line_of: Callable[[LoadedFamily], str] | None = None
    lora_marks: tuple[tuple[str, str], ...] = ()
    version_marks: tuple[tuple[str, str], ...] = ()
    to_original: Callable[[Mapping[str, Any]], dict[str, Any]] | None = None
    comfy_original: Callable[[Any], str] | None = None
    comfy_keys: Callable[[Any, str], dict[str, tuple[int, ...] | None]] | None = None
    comfy_model_name: Callable[[Any], str | None] | None = None
    own_layout: str = "kohya"
    layout_names: Mapping[str, str] = field(default_factory=dict)
    folds_alpha: bool = False


@dataclass(frozen=True, kw_only=True)
class FamilyEntry:
    """One registered model family.

    ``name``: its kind ("flux"), the owner of [flow] keys. ``label``: its short name in messages
    ("Flux.1": "applies to Flux.1 models"); ``models``: what config messages call its models
    ("FLUX.1": "is a FLUX.1 model"), after ``article``; ``lines``: its model lines where
    messages list what difftune trains ("SD 1.x/2.x", "SDXL"). ``family``: its ModelFamily
    class (class data such as PIXEL_MULTIPLE is known before any weight is read).
    ``claims(model, flow)``: the family reads this model (a cheap look at its files).
    ``claimed_last``: its claim is asked after every other family's. ``load(model, flow,
    weight_dtype, vae_dtype)``: its Components. ``claims_within``: the family whose models its
    own are a kind of (the same parts, told apart by a finer look), whose broader claim is asked
    after its own; ``file_setting``: the [flow] setting that says a transformer file of that
    family is one of this family's (nothing in the file tells them apart). ``reads_vae``: the loader itself honours [model]
    vae (else the shared loader replaces the VAE afterwards). ``network_module``: the kohya
    network_module of its trainer (the one suggested to a config written for another family).
    ``flow_matching``: trained and sampled by flow matching (Euler sampling only), not DDPM.
    ``config_keys``: the config Sections (pydantic models) defining the [flow] keys it owns,
    each key's type, bounds and help (library.config.flow_schema composes the section of every
    family's and the shared flow-matching keys; a class several families share is named by each).
    ``flow_keys``: the [flow] keys it reads, its own and shared ones (the other families refuse
    them by name). ``timestep_draws``: the timestep_sampling values named after it (musubi-tuner's
    draws for its models, such as its resolution-dependent shift), which it alone reads (the
    other families refuse them by name; library.config.flow_schema adds them to the key's values).
    ``model_versions``: the [flow] model_version values its models take (musubi-tuner's
    --model_version), each with what it names; the family checks a set one against its files.
    ``model_family(model, flow)``: the ModelFamily class of this model where the family's
    models differ in class data (Wan 2.2 TI2V-5B's frame rate and pixel grid; a cheap look at
    its files); None: ``family`` for every model.
    ``edit``: for an edit variant of the family ``family`` names (library.models.families
    .edit_variant), its data and hooks; the entry's ``label`` is the variant's.
    ``kohya``, ``lora_files``, ``tool``: its kohya vocabulary, how its LoRA files are told
    apart, what lora_tool.py needs. (A family's conformance kit is no part of its entry: the
    tests find it by the family's name, tests/kits/<name>/kit.py.)"""

    name: str
    label: str
    models: str
    article: str = "a"
    lines: tuple[str, ...]
    family: Callable[[], type]
    load: Callable[[ModelSection, FlowSection, object, object], object]
    claims: Callable[[ModelSection, FlowSection], bool]
    claimed_last: bool = False
    claims_within: str | None = None
    file_setting: str | None = None
    reads_vae: bool = False
    network_module: str
    flow_matching: bool = False
    config_keys: tuple[type[Section], ...] = ()
    flow_keys: frozenset[str] = frozenset()
    timestep_draws: tuple[str, ...] = ()
    model_versions: Mapping[str, str] = field(default_factory=dict)
    model_family: Callable[[ModelSection, FlowSection], type] | None = None
    edit: EditVariant | None = None
    kohya: KohyaVocabulary = KohyaVocabulary()
    lora_files: LoraFiles = LoraFiles()
    tool: ToolFacts = ToolFacts()

    def family_of(self, model: ModelSection, flow: FlowSection) -> type:
        """The ModelFamily class of this model (``model_family``'s, else ``family``)."""
        return self.model_family(model, flow) if self.model_family else self.family()

    @property
    def reference_images(self) -> ReferenceCounts:
        """How many reference images a sample takes (the edit variant's, else the family
        class's REFERENCE_IMAGES): known before any weight is read."""
        return self.edit.reference_images if self.edit else self.family().REFERENCE_IMAGES

    def references_text(self) -> str:
        """``reference_images`` in words ("1 reference image")."""
        return edit_variant.references_text(self.reference_images)

    @property
    def a_models(self) -> str:
        """``models`` with its article ("a FLUX.1", "an SD3/SD3.5")."""
        return f"{self.article} {self.models}"
