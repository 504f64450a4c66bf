"""A family's loading facts as data: its pipeline, parts, single files, name tables, tokenizers.

A ``FamilySpec`` says, per part (``SpecPart``): its role (denoiser, VAE, text encoder), the
diffusers or transformers class reading it (``"module:Class"``), its subfolder in a diffusers
folder, its dtype (the VAE's or the weights'), and where it is in single files: the main file
(``MainFile``: pretrained_model_name_or_path, under declared key prefixes, renamed by the
family's ``NameTable``, its config from the header or from the shapes) or a component file a
config key names (``ComponentFile``: [flow] t5xxl, ae, text_encoder, ...; read by a shared part
reader, library/models/families/file_plans.py). Per family: the pipeline class its folders are,
its tokenizers (shared kinds: T5, CLIP, local ones; folder_loader.py), its own look at the
checked parts (``inspect``: widths that must agree, a variant), how its files are recognised
(key marks; header text of a damaged file).

From the spec, shared code derives the rest (spec_loader.py): the diffusers folder declaration
(``PipelineFolder``), the single-file reader, which models the family claims, and the layout
detection of a main file. Nothing here imports a family.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import torch

from library.models.checkpoint_file import CheckpointFile
from library.models.families.folder_loader import (
    CheckedFolder,
    FolderPart,
    FolderTokenizer,
)
from library.models.families.name_table import CHECKPOINT_PREFIX, NameTable
from library.models.plans import Plan

Role = Literal["denoiser", "vae", "text_encoder", "image_encoder"]
Layout = Literal["original", "diffusers"]


@dataclass(frozen=True)
class MainFile:
    """How the denoiser is read from the main single file.

    ``names``: its original <-> diffusers table; ``original_marks`` / ``diffusers_marks``: keys
    only this model has together, in each layout (the file's layout and prefix are found by
    them); ``config_from_shapes(shapes)``: its config from diffusers-named shapes (the header's
    config is tried first); ``damaged``: header text that still names a damaged file as this
    model's; ``example``: the released file's name, for messages; ``prefixes``: where its keys
    may start in a file (a full checkpoint's other parts are left out); ``dropped``: original
    keys the diffusers module has no place for (read past, never loaded); ``fixed``: config
    values kept whichever config is chosen (what a release's file does not say, such as an
    edit release's flag); ``others``: prefixes of the other parts a full checkpoint holds
    beside the denoiser (never read as its keys, whatever its own prefix); ``build(config)``:
    the module built for the plan (None: the part's class ``from_config``), for a model whose
    construction computes a buffer its file holds anyway (SD3's position table)."""

    names: NameTable
    original_marks: tuple[str, ...]
    diffusers_marks: tuple[str, ...]
    config_from_shapes: Callable[[Mapping[str, tuple[int, ...]]], dict]
    damaged: re.Pattern
    example: str
    prefixes: tuple[str, ...] = ("", CHECKPOINT_PREFIX)
    dropped: tuple[str, ...] = ()
    fixed: Mapping[str, object] = field(default_factory=dict)
    others: tuple[str, ...] = ()
    build: Callable[[dict], torch.nn.Module] | None = None

    def detect(self, keys: Iterable[str]) -> tuple[Layout, str] | None:
        """(layout, the prefix of its keys) of a state dict holding this model; None for any
        other, by key names only. A mark ending in "." stands for any key starting so; the
        diffusers marks are tried first (the original ones may be a part of them)."""
        keys = set(keys)
        for layout, marks in (
            ("diffusers", self.diffusers_marks),
            ("original", self.original_marks),
        ):
            for prefix in self.prefixes:
                if all(_marked(keys, prefix + mark) for mark in marks):
                    return layout, prefix
        return None


def _marked(keys: set[str], mark: str) -> bool:
    return any(k.startswith(mark) for k in keys) if mark.endswith(".") else mark in keys


@dataclass(frozen=True)
class ComponentFile:
    """A part's own single file, named by the config key ``key`` in ``section``.

    ``what``: what the file must hold, as messages say it; ``plan(file)``: the part's plan from
    the opened file (a shared reader with the family's facts); ``other(path)``: for a value that
    is not a .safetensors file (a diffusers VAE folder), a function loading the part in a dtype;
    None: only .safetensors files are read, and, with ``folders``, diffusers folders of the
    part's class (its own config.json and weights, or a folder holding the part's subfolder);
    with ``pickles``, torch files too (.pth: tensors only, never pickled code).
    ``inside(main)``: the part's plan from the main file, for a family whose full checkpoints
    may hold it (None when this one does not); used while the key is unset."""

    key: str
    section: str
    what: str
    plan: Callable[[CheckpointFile], Plan]
    other: Callable[[Path], Callable[[torch.dtype], torch.nn.Module]] | None = None
    folders: bool = False
    pickles: bool = False
    inside: Callable[[CheckpointFile], Plan | None] | None = None


@dataclass(frozen=True)
class SpecPart:
    """One model part (module docstring). ``base``: the released config, which the folder's
    config.json is read over (None: the folder's alone)."""

    role: Role
    sub: str
    cls: str
    main: MainFile | None = None
    file: ComponentFile | None = None
    base: Callable[[], dict] | None = None
    label: str = ""  # how messages name it; "": "<family> <sub>"

    @property
    def folder_part(self) -> FolderPart:
        key = self.file.key if self.file else None
        return FolderPart(self.sub, self.cls, key, self.base, vae=self.role == "vae")


@dataclass(frozen=True)
class FamilySpec:
    """A family's models as data (module docstring).

    ``family``: how messages name its models; ``pipeline``: the pipeline class its folders must
    be (``other_pipelines``: further classes whose folders it is asked about, refused by name);
    ``inspect(checked)``: the family's look at the checked parts (a CheckedFolder, or the
    single files' CheckedFiles: ``part_config(sub)``, ``part_source(sub)``, ``model_dir``),
    before anything loads; its result comes back as the loaded parts' ``facts``. ``other``:
    subfolders a folder must hold besides the parts and tokenizers -> the file each holds."""

    family: str
    pipeline: str
    parts: tuple[SpecPart, ...]
    tokenizers: tuple[FolderTokenizer, ...]
    inspect: Callable[[CheckedFolder], object] = lambda checked: None
    other: Mapping[str, str | None] = field(default_factory=dict)

    @property
    def denoiser(self) -> SpecPart:
        return next(part for part in self.parts if part.role == "denoiser")

    @property
    def main(self) -> MainFile:
        main = self.denoiser.main
        if main is None:
            raise ValueError(f"{self.family}'s spec declares no main single file")
        return main

    def part(self, sub: str) -> SpecPart:
        return next(part for part in self.parts if part.sub == sub)

    def by_key(self, key: str) -> SpecPart:
        """The part whose component file the config key ``key`` names."""
        return next(part for part in self.parts if part.file and part.file.key == key)
