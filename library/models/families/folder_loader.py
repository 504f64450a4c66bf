"""One loader for the diffusers pipeline folders of the transformer families, driven by data.

A family declares its folder as a ``PipelineFolder``: the pipeline class its model_index.json
names, each part (``FolderPart``: its subfolder, the class that reads it, the file it must hold,
its weights file's stem, whether it loads in the weight or the VAE dtype, and the config key
whose component file replaces it), the function that plans such a file, its tokenizers
(``FolderTokenizer``: subfolder, the config key whose tokenizer replaces the folder's, the
function that reads it) and any other subfolder it needs. ``load_folder`` plans the component
files that are set, checks every part and weights file the folder must give before any weight
loads (``checked_pipeline_folder``), lets the family look at the checked folder (``inspect``: its
variant, its channel and width checks), reads the tokenizers, then the parts, each from its
component file where one replaces it, and freezes every module. What a family builds from the
loaded modules (its parts, its Components) stays in its own package.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import torch

from library.config.flow_schema import FlowSection
from library.config.schema import ModelSection
from library.errors import ModelError
from library.models.families.family_entry import Deferred
from library.models.families.file_plans import Plan, load_plan
from library.models.families.flux.tokenizers import folder_t5_tokenizer, t5_tokenizer_files
from library.models.loader import (
    check_weights_file,
    find_weights,
    load_weights,
    offline,
    read_json,
    resolve_model_dir,
)
from library.models.tokenizers import EncoderKind, folder_tokenizer

# What a component file gives in place of a folder's part: the plan of a checked .safetensors
# file, or a function loading the part in a dtype (a replacement read another way, such as a
# VAE folder).
Replacement = Plan | Callable[[torch.dtype], torch.nn.Module]


@dataclass(frozen=True)
class FolderPart:
    """One model part of a pipeline folder, in ``sub``/.

    ``cls``: the diffusers or transformers class reading it, as ``"module:Class"``, imported
    when the part loads. ``file_key``: the config key ([model] or [flow]) whose component file
    replaces the part (the folder then need not hold it). ``base``: the full-size config the
    folder's config.json is read over, for a part whose config the family checks (a text
    encoder's widths). ``vae``: it loads in the VAE dtype, not the weight dtype. ``required``:
    the file ``sub``/ must hold; ``stem``: its weights file's name (loader.find_weights), by
    default the one its library saves (transformers: model, diffusers:
    diffusion_pytorch_model)."""

    sub: str
    cls: str
    file_key: str | None = None
    base: Callable[[], dict] | None = None
    vae: bool = False
    required: str = "config.json"
    stem: str | None = None

    @property
    def weights_stem(self) -> str:
        """The stem of the part's weights file."""
        if self.stem:
            return self.stem
        return "model" if self.cls.startswith("transformers:") else "diffusion_pytorch_model"


@dataclass(frozen=True)
class FolderTokenizer:
    """One tokenizer of a pipeline folder, in ``sub``/.

    ``read(folder)`` reads it: the folder's, or, when the config key ``key`` is set, the one
    that key names (the folder then need not hold it). ``t5``: a T5 tokenizer folder
    (tokenizer.json or spiece.model), checked by ``checked_pipeline_folder``; else one with
    vocab.json + merges.txt or tokenizer.json (loader.resolve_model_dir)."""

    sub: str
    read: Callable[[CheckedFolder], object]
    key: str = "tokenizer_path"
    t5: bool = False


def _nothing(folder: CheckedFolder) -> None:
    return None


@dataclass(frozen=True)
class PipelineFolder:
    """A family's diffusers pipeline folder, as data for ``load_folder``.

    ``pipeline``: the class model_index.json must name; ``family``: how messages name the
    family's models. ``plan_file(key, value)``: the replacement of the part whose ``file_key`` is
    ``key``, from the key's value, each file checked before any weight is read. ``other``:
    subfolders besides the parts and tokenizers that must be there -> the file each must hold.
    ``inspect(folder)``: the family's look at the checked folder before anything loads (its
    variant, channel and width checks); ``load_folder`` returns what it returns."""

    pipeline: str
    family: str
    parts: tuple[FolderPart, ...]
    tokenizers: tuple[FolderTokenizer, ...]
    plan_file: Callable[[str, str], Replacement] | None = None
    other: Mapping[str, str] = field(default_factory=dict)
    inspect: Callable[[CheckedFolder], object] = _nothing


def option(model: ModelSection, flow: FlowSection, key: str):
    """The value of the config key ``key``, from [model] or [flow] (each key is in one)."""
    return getattr(model, key) if key in type(model).model_fields else getattr(flow, key)


@dataclass
class CheckedFolder:
    """A pipeline folder after its checks: where it is, its transformer's config.json, its T5
    tokenizer folder (None when another is set or it has none), and the replacement of each
    component-file key that is set."""

    model_dir: Path
    config: dict
    t5_tokenizer_dir: Path | None
    plans: dict[str, Replacement]
    spec: PipelineFolder
    model: ModelSection
    flow: FlowSection
    _configs: dict[str, dict] = field(default_factory=dict)

    def _part(self, sub: str) -> FolderPart:
        return next(part for part in self.spec.parts if part.sub == sub)

    def part_config(self, sub: str) -> dict:
        """The config of the part in ``sub``/: its component file's plan's when one replaces
        it, else its config.json over the part's ``base``."""
        if sub not in self._configs:
            part = self._part(sub)
            if part.file_key in self.plans:
                self._configs[sub] = self.plans[part.file_key].config
            else:
                config = read_json(self.model_dir / sub / "config.json")
                self._configs[sub] = {**(part.base() if part.base else {}), **config}
        return self._configs[sub]

    def part_source(self, sub: str) -> str:
        """How messages name the part in ``sub``/: its component file, or the subfolder."""
        key = self._part(sub).file_key
        if key in self.plans:
            return f"{key} = {self.plans[key].file.path}"
        return str(self.model_dir / sub)


@dataclass
class LoadedFolder:
    """The loaded folder: its modules and tokenizers by subfolder, in the spec's order (every
    module frozen, in eval mode, on the CPU), and what the family's ``inspect`` returned."""

    model_dir: Path
    facts: object
    modules: dict[str, torch.nn.Module]
    tokenizers: dict[str, object]


def load_folder(
    spec: PipelineFolder, path: Path, model: ModelSection, flow: FlowSection,
    weight_dtype: torch.dtype, vae_dtype: torch.dtype,
) -> LoadedFolder:  # fmt: skip
    """The folder ``path`` as ``spec`` declares it; ModelError for any problem with its files,
    found before any weight is read where a header or a config shows it."""
    # The VAE's file last, as the single-file loaders read theirs: the first broken file a
    # user sees is the same whichever way the model is given.
    plans = {
        part.file_key: spec.plan_file(part.file_key, value)
        for part in sorted(spec.parts, key=lambda part: part.vae)
        if part.file_key and (value := option(model, flow, part.file_key))
    }
    skip = {part.sub for part in spec.parts if part.file_key in plans}
    skip |= {tokenizer.sub for tokenizer in spec.tokenizers if option(model, flow, tokenizer.key)}
    required = {part.sub: part.required for part in spec.parts} | dict(spec.other)
    required |= {tokenizer.sub: None for tokenizer in spec.tokenizers if not tokenizer.t5}
    model_dir, t5_dir, config = checked_pipeline_folder(
        path,
        {sub: file for sub, file in required.items() if sub not in skip},
        {part.sub: part.weights_stem for part in spec.parts if part.sub not in skip},
        spec.pipeline,
        next((t.sub for t in spec.tokenizers if t.t5 and t.sub not in skip), None),
        spec.family,
    )
    folder = CheckedFolder(model_dir, config, t5_dir, plans, spec, model, flow)
    facts = spec.inspect(folder)
    with offline():
        # Tokenizers first: a broken one fails in a second, not after the weights.
        tokenizers = {tokenizer.sub: tokenizer.read(folder) for tokenizer in spec.tokenizers}
        modules = {
            part.sub: _load_part(part, folder, vae_dtype if part.vae else weight_dtype)
            for part in spec.parts
        }
    for module in modules.values():
        module.requires_grad_(False)
        module.eval()
    return LoadedFolder(model_dir, facts, modules, tokenizers)


def _load_part(part: FolderPart, folder: CheckedFolder, dtype: torch.dtype) -> torch.nn.Module:
    replacement = folder.plans.get(part.file_key) if part.file_key else None
    if isinstance(replacement, Plan):
        return load_plan(replacement, dtype)
    if replacement is not None:
        return replacement(dtype)
    cls = Deferred(part.cls).get()
    return load_weights(cls, folder.model_dir, part.sub, dtype, part.weights_stem)


def clip_tokenizer(sub: str, kind: EncoderKind, index: int, encoder: str, name: str):
    """The CLIP tokenizer in ``sub``/ (tokenizer_path's replaces it) of text encoder ``index``
    (``name`` in messages), checked against the config of the encoder in ``encoder``/."""

    def read(folder: CheckedFolder):
        config = folder.part_config(encoder)
        tokenizer_path = folder.model.tokenizer_path
        return folder_tokenizer(folder.model_dir, sub, kind, index, tokenizer_path, config, name)

    return FolderTokenizer(sub, read)


def t5_tokenizer(
    sub: str, encoder: str, find: Callable | None = None, missing: Callable | None = None
) -> FolderTokenizer:
    """The T5 tokenizer in ``sub``/ (t5_tokenizer_path's replaces it: found by ``find``, with
    ``missing``'s message; flux.tokenizers.folder_t5_tokenizer), checked against the config of
    the encoder in ``encoder``/."""

    def read(folder: CheckedFolder):
        return folder_t5_tokenizer(
            folder.model_dir, folder.t5_tokenizer_dir, folder.flow.t5_tokenizer_path,
            folder.part_config(encoder), sub, find, missing,
        )  # fmt: skip

    return FolderTokenizer(sub, read, key="t5_tokenizer_path", t5=True)


def checked_pipeline_folder(
    path: Path,
    required: dict[str, str | None],
    weights: dict[str, str],
    pipeline_class: str,
    t5_subfolder: str | None,
    family: str,
) -> tuple[Path, Path | None, dict]:
    """(model folder, its T5 tokenizer folder, the transformer's config.json) of a diffusers
    ``pipeline_class`` folder, after checking its parts and the header of every weights file
    (``weights``: subfolder -> weights file stem), so a broken folder fails before minutes of
    loading. ModelError naming the folder otherwise. ``t5_subfolder`` None: the T5 tokenizer
    comes from elsewhere (t5_tokenizer_path), and the folder's is not looked at."""
    model_dir = resolve_model_dir(str(path), required)
    index = read_json(model_dir / "model_index.json")
    if index.get("_class_name") != pipeline_class:
        raise ModelError(
            f"{model_dir} holds a {index.get('_class_name')}; only text-to-image {family} "
            f"({pipeline_class}) can be trained"
        )
    for sub, stem in weights.items():
        for file in find_weights(model_dir / sub, stem)[0]:
            check_weights_file(file, family)
    t5_tokenizer = None
    if t5_subfolder is not None:
        t5_dir = model_dir / t5_subfolder
        if not t5_dir.is_dir():
            raise ModelError(
                f"{model_dir} lacks the {t5_subfolder}/ subfolder; the diffusers folder is "
                "incomplete (or set t5_tokenizer_path in [flow])"
            )
        t5_tokenizer = t5_tokenizer_files(t5_dir, "the diffusers folder is incomplete")
    return model_dir, t5_tokenizer, read_json(model_dir / "transformer" / "config.json")
