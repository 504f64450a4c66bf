"""One loader for the diffusers pipeline folders of the transformer families, driven by data.

A family declares its folder as a ``PipelineFolder`` (its pipeline class, parts, tokenizers, the
function planning a component file that replaces a part, and its own look at the folder);
``load_folder`` plans the component files set, checks every part, tokenizer folder and weights
file before any weight is read, lets the family look at the checked folder (``inspect``), reads
the tokenizers, then the parts (from their component files where set), and freezes every module.
What a family builds from the loaded modules stays in its own package.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from library.config.flow_section import FlowSection
from library.config.model_schema import ModelSection
from library.errors import ModelError
from library.models.families.claims import other_pipeline_error
from library.models.families.family_entry import Deferred
from library.models.families.file_plans import Plan, load_plan
from library.models.model_files import (
    check_weights_file,
    find_weights,
    load_weights,
    offline,
    read_json,
    resolve_model_dir,
)
from library.models.text_encoders.t5 import (
    load_t5_tokenizer,
    located_t5_tokenizer,
    t5_tokenizer_files,
)
from library.models.tokenizer_fit import TokenizerSource
from library.models.tokenizers import EncoderKind, folder_tokenizer, load_tokenizer_for

# What a component file gives in place of a folder's part: the plan of a checked .safetensors
# file, or a function loading the part in a dtype (a replacement read another way, such as a
# VAE folder).
Replacement = Plan | Callable[[torch.dtype], torch.nn.Module]


@dataclass(frozen=True)
class FolderPart:
    """One model part of a pipeline folder, in ``sub``/ (which must hold config.json).

    ``cls``: the diffusers or transformers class reading it, as ``"module:Class"``, imported
    when the part loads; its weights file is the one that library writes. ``file_key``: the
    config key whose component file replaces the part (the folder then need not hold it).
    ``base``: the full-size config the folder's config.json is read over, for a part whose
    config the family checks. ``vae``: it loads in the VAE dtype, not the weight dtype."""

    sub: str
    cls: str
    file_key: str | None = None
    base: Callable[[], dict] | None = None
    vae: bool = False

    @property
    def stem(self) -> str:
        """The stem of the part's weights file (loader.find_weights)."""
        return "model" if self.cls.startswith("transformers:") else "diffusion_pytorch_model"


@dataclass(frozen=True)
class FolderTokenizer:
    """One tokenizer of a pipeline folder, in ``sub``/.

    ``read(folder)`` reads it: the folder's, or, when the config key ``key`` is set, the one
    that key names (the folder then need not hold it). ``t5``: a T5 tokenizer folder, which
    must hold tokenizer.json or spiece.model; else vocab.json + merges.txt or tokenizer.json.
    ``read_files(files)``: how it is found beside single files (spec_loader.CheckedFiles:
    ``part_config``, ``model_dir``, ``model``, ``flow``); None: it is not."""

    sub: str
    read: Callable[[CheckedFolder], object]
    key: str = "tokenizer_path"
    t5: bool = False
    read_files: Callable[[Any], object] | None = None


@dataclass(frozen=True)
class PipelineFolder:
    """A family's diffusers pipeline folder, as data for ``load_folder``.

    ``pipeline``: the class model_index.json must name; ``family``: how messages name the
    family's models. ``plan_file(key, value)``: the replacement of the part whose ``file_key`` is
    ``key``, from the key's value, each file checked before any weight is read. ``other``:
    subfolders besides the parts and tokenizers that must be there -> the file each must hold
    (None: the family checks its files).
    ``inspect(folder)``: the family's look at the checked folder before anything loads (its
    variant, channel and width checks); ``load_folder`` returns what it returns."""

    pipeline: str
    family: str
    parts: tuple[FolderPart, ...]
    tokenizers: tuple[FolderTokenizer, ...]
    inspect: Callable[[CheckedFolder], object]
    plan_file: Callable[[str, str], Replacement] | None = None
    other: Mapping[str, str | None] = field(default_factory=dict)


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

    def _part(self, sub: str) -> FolderPart:
        return next(part for part in self.spec.parts if part.sub == sub)

    def part_config(self, sub: str) -> dict:
        """The config of the part in ``sub``/: its component file's plan's when one replaces
        it, else its config.json over the part's ``base``."""
        part = self._part(sub)
        if part.file_key in self.plans:
            return self.plans[part.file_key].config
        return {
            **(part.base() if part.base else {}),
            **read_json(self.model_dir / sub / "config.json"),
        }

    def part_source(self, sub: str) -> str:
        """How messages name the part in ``sub``/: its component file, or the subfolder."""
        key = self._part(sub).file_key
        if key in self.plans:
            return f"{key} = {self.plans[key].file.path}"
        return str(self.model_dir / sub)


def check_width(checked, part: str, has: int, wanted: str, states: str, fix: str) -> None:
    """``part``'s states (``has`` wide) are as wide as the transformer's input of them (its
    config's ``wanted``), in a checked folder or checked single files (spec_loader's
    CheckedFiles); ModelError naming both, the ``states`` and the ``fix``."""
    reads = checked.part_config("transformer")[wanted]
    if has != reads:
        raise ModelError(
            f"{checked.part_source(part)} gives {has}-wide {states} and the transformer of "
            f"{checked.model_dir} reads {reads}-wide ones; {fix}"
        )


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
    folder = _checked_folder(spec, path, model, flow, plans)
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
    return LoadedFolder(folder.model_dir, facts, modules, tokenizers)


def _checked_folder(
    spec: PipelineFolder, path: Path, model: ModelSection, flow: FlowSection,
    plans: dict[str, Replacement],
) -> CheckedFolder:  # fmt: skip
    """``path`` after checking it holds the pipeline ``spec`` names, each part and tokenizer
    folder no config key replaces, and whole weights files, so a broken folder fails before
    minutes of loading; ModelError naming the folder otherwise."""
    skip = {part.sub for part in spec.parts if part.file_key in plans}
    skip |= {tokenizer.sub for tokenizer in spec.tokenizers if option(model, flow, tokenizer.key)}
    required = {part.sub: "config.json" for part in spec.parts} | dict(spec.other)
    required |= {tokenizer.sub: None for tokenizer in spec.tokenizers if not tokenizer.t5}
    model_dir = resolve_model_dir(str(path), {s: f for s, f in required.items() if s not in skip})
    index = read_json(model_dir / "model_index.json")
    if index.get("_class_name") != spec.pipeline:
        raise other_pipeline_error(model_dir, index.get("_class_name"), spec.pipeline, spec.family)
    for part in spec.parts:
        if part.sub not in skip:
            for file in find_weights(model_dir / part.sub, part.stem)[0]:
                check_weights_file(file, spec.family)
    t5_dir = None
    for tokenizer in spec.tokenizers:
        # The CLIP tokenizer check would ask a T5 folder for vocab.json + merges.txt.
        if tokenizer.t5 and tokenizer.sub not in skip:
            t5_dir = model_dir / tokenizer.sub
            if not t5_dir.is_dir():
                raise ModelError(
                    f"{model_dir} lacks the {tokenizer.sub}/ subfolder; the diffusers folder is "
                    "incomplete (or set t5_tokenizer_path in [flow])"
                )
            t5_dir = t5_tokenizer_files(t5_dir, "the diffusers folder is incomplete")
    config = read_json(model_dir / "transformer" / "config.json")
    return CheckedFolder(model_dir, config, t5_dir, plans, spec, model, flow)


def _load_part(part: FolderPart, folder: CheckedFolder, dtype: torch.dtype) -> torch.nn.Module:
    replacement = folder.plans.get(part.file_key) if part.file_key else None
    if isinstance(replacement, Plan):
        return load_plan(replacement, dtype)
    if replacement is not None:
        return replacement(dtype)
    cls = Deferred(part.cls).get()
    return load_weights(cls, folder.model_dir, part.sub, dtype, part.stem)


def clip_tokenizer(
    sub: str, kind: EncoderKind, index: int, encoder: str, name: str
) -> FolderTokenizer:
    """The CLIP tokenizer in ``sub``/ (tokenizer_path's replaces it) of text encoder ``index``
    (``name`` in messages), checked against the config of the encoder in ``encoder``/."""

    def read(folder: CheckedFolder):
        config = folder.part_config(encoder)
        tokenizer_path = folder.model.tokenizer_path
        return folder_tokenizer(folder.model_dir, sub, kind, index, tokenizer_path, config, name)

    def read_files(files):
        model, config = files.model, files.part_config(encoder)
        return load_tokenizer_for(
            kind, index, files.model_dir, model.tokenizer_path, model.tokenizer_cache_dir,
            config, name,
        )  # fmt: skip

    return FolderTokenizer(sub, read, read_files=read_files)


def t5_tokenizer(
    sub: str, encoder: str, find: Callable[[str | None, str | None], Path | None],
    missing: Callable[[str, Path], str],
) -> FolderTokenizer:  # fmt: skip
    """The T5 tokenizer in ``sub``/, checked against the config of the encoder in ``encoder``/;
    t5_tokenizer_path's replaces it, found by ``find``, with ``missing``'s message when it is
    not there (beside single files, ``find`` also looks in tokenizer_cache_dir and the Hugging
    Face cache)."""

    def read(folder: CheckedFolder):
        path_text, model_dir = folder.flow.t5_tokenizer_path, folder.model_dir
        if path_text:
            message = missing(path_text, model_dir)
            found, source = located_t5_tokenizer(find(path_text, None), path_text, None, message)
        else:
            fix = f"{model_dir} must hold T5-XXL's own tokenizer in {sub}/: restore it"
            found = folder.t5_tokenizer_dir
            source = TokenizerSource("pretrained_model_name_or_path", fix)
        return load_t5_tokenizer(found, folder.part_config(encoder), source)

    def read_files(files):
        path_text, cache_dir = files.flow.t5_tokenizer_path, files.model.tokenizer_cache_dir
        message = missing(path_text, files.model_dir)
        found, source = located_t5_tokenizer(
            find(path_text, cache_dir), path_text, cache_dir, message
        )
        return load_t5_tokenizer(found, files.part_config(encoder), source)

    return FolderTokenizer(sub, read, key="t5_tokenizer_path", t5=True, read_files=read_files)
