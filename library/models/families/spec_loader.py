"""The one loader of a family spec (spec.py): its diffusers folders and its single files.

``load_spec`` reads a model as the spec declares it: a diffusers folder through the shared
folder loader (folder_loader.py, with the ``PipelineFolder`` derived from the spec), or the
main single file (pretrained_model_name_or_path) with each part's component file (a [flow] or
[model] key). Every file's header is read, its layout and prefix found by the spec's key marks,
and every part planned through the one plan system (library/models/plans.py: the header's
config, else the one the shapes show, each checked on the meta device against the file's
tensors) before any weight is read; then the family's ``inspect`` and the tokenizers, then the
weights. ``claims`` says whether a model is the family's, from the same spec.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import torch

from library.config.flow_section import FlowSection
from library.config.model_schema import ModelSection
from library.errors import ModelError
from library.models.checkpoint_file import CheckpointFile
from library.models.components import Components
from library.models.families.claims import claims_model, file_keys, folder_pipeline
from library.models.families.family_entry import Deferred
from library.models.families.file_contents import sample_keys
from library.models.families.file_plans import open_safetensors
from library.models.families.folder_loader import (
    LoadedFolder,
    PipelineFolder,
    Replacement,
    load_folder,
    option,
)
from library.models.families.shape_origins import convert_shapes
from library.models.families.spec import ComponentFile, FamilySpec, SpecPart
from library.models.model_files import load_weights, offline, one_line, read_json
from library.models.plans import CONFIG_METADATA, Plan, choose_plan, load_plan
from library.saving.streamed import block_groups, save_streamed

WHAT = "pretrained_model_name_or_path"


def claims(spec: FamilySpec, model: ModelSection) -> bool:
    """True for a folder of the spec's pipeline (or one whose denoiser is its class: another
    pipeline of the family is refused by name), or a .safetensors file whose keys hold the
    spec's denoiser (a damaged one by its header text)."""
    main = spec.main
    denoiser_class = spec.denoiser.cls.split(":")[1]
    return claims_model(
        model, spec.pipeline, denoiser_class, main.detect, main.damaged, spec.family
    )


def claimer(*specs: FamilySpec) -> Callable[[ModelSection, FlowSection], bool]:
    """The registry entry's ``claims(model, flow)`` of the family ``specs`` describe (one per
    pipeline of the family: ``spec_for`` picks a model's)."""
    return lambda model, flow: claims(spec_for(specs, model), model)


def spec_for(specs: Sequence[FamilySpec], model: ModelSection) -> FamilySpec:
    """The spec of ``model``: the one whose pipeline its folder is; for a single file, the one
    whose main file its keys hold by the most marks (a release with an extra input, such as a
    guidance embedder, over the one without); else the first (for folders the first claims or
    refuses by name)."""
    path = Path(model.pretrained_model_name_or_path).expanduser()
    if path.is_file() and len(specs) > 1:
        keys = file_keys(path) or ()
        held = [spec for spec in specs if spec.main.detect(keys)]
        return max(held, key=_mark_count, default=specs[0])  # the first of equals
    pipeline = folder_pipeline(path) if path.is_dir() else None
    return next((spec for spec in specs if spec.pipeline == pipeline), specs[0])


def _mark_count(spec: FamilySpec) -> int:
    return len(spec.main.original_marks) + len(spec.main.diffusers_marks)


def folder_of(spec: FamilySpec) -> PipelineFolder:
    """The diffusers folder the spec declares, for the shared folder loader."""

    def plan_file(key: str, value: str) -> Replacement:
        part = next(p for p in spec.parts if p.file and p.file.key == key)
        return plan_component(spec, part, value)

    return PipelineFolder(
        pipeline=spec.pipeline,
        family=spec.family,
        parts=tuple(part.folder_part for part in spec.parts),
        tokenizers=spec.tokenizers,
        inspect=spec.inspect,
        plan_file=plan_file,
        other=spec.other,
    )


def load_spec(
    spec: FamilySpec, model: ModelSection, flow: FlowSection, weight_dtype: torch.dtype,
    vae_dtype: torch.dtype,
) -> LoadedFolder:  # fmt: skip
    """The model ``pretrained_model_name_or_path`` names, as ``spec`` declares it: its modules
    and tokenizers by subfolder (frozen, in eval mode, on the CPU) and what ``inspect`` found.
    ModelError for any problem with its files, found before any weight is read."""
    path = Path(model.pretrained_model_name_or_path).expanduser().absolute()
    if path.is_dir():
        return load_folder(folder_of(spec), path, model, flow, weight_dtype, vae_dtype)
    return load_files(spec, path, model, flow, weight_dtype, vae_dtype)


def components(spec: FamilySpec, loaded: LoadedFolder, objective, family) -> Components:
    """``load_spec``'s model as the trainer's Components: the spec's denoiser, its VAE, its
    text encoders in the spec's order and the tokenizers, with ``objective`` and ``family``."""

    def of(role: str) -> tuple[torch.nn.Module, ...]:
        return tuple(loaded.modules[part.sub] for part in spec.parts if part.role == role)

    (vae,) = of("vae")
    return Components(
        denoiser=loaded.modules[spec.denoiser.sub], vae=vae, text_encoders=of("text_encoder"),
        tokenizers=tuple(loaded.tokenizers.values()), objective=objective, family=family,
        model_dir=loaded.model_dir,
    )  # fmt: skip


def folder_scheduler(model_dir: Path, released: Mapping) -> dict:
    """The sampling scheduler's config: a folder's ``scheduler/`` (its own keys, not diffusers'
    ``_`` ones), else ``released`` (single files carry none)."""
    path = model_dir / "scheduler" / "scheduler_config.json"
    stored = read_json(path) if path.is_file() else released
    return {k: v for k, v in stored.items() if not k.startswith("_")}


@dataclass
class CheckedFiles:
    """The single files after their checks: the main file (``model_dir``, as a folder is
    named in messages) and each part's plan (or loader) by subfolder."""

    model_dir: Path
    plans: dict[str, Replacement]
    spec: FamilySpec
    model: ModelSection
    flow: FlowSection

    @property
    def config(self) -> dict:
        """The denoiser's config."""
        return self.part_config(self.spec.denoiser.sub)

    def part_config(self, sub: str) -> dict:
        plan = self.plans[sub]
        if not isinstance(plan, Plan):
            raise ModelError(f"the {sub} of {self.model_dir} has no config before it loads")
        return plan.config

    def part_source(self, sub: str) -> str:
        plan = self.plans[sub]
        return plan.where if isinstance(plan, Plan) else str(self.model_dir)


def load_files(
    spec: FamilySpec, path: Path, model: ModelSection, flow: FlowSection,
    weight_dtype: torch.dtype, vae_dtype: torch.dtype,
) -> LoadedFolder:  # fmt: skip
    """The main file ``path`` and each part's component file (module docstring)."""
    if not path.is_file():
        raise ModelError(f"model file {path} does not exist; nothing is downloaded")
    main = open_safetensors(path, WHAT, spec.family)
    plans: dict[str, Replacement] = {spec.denoiser.sub: plan_main(spec, main)}
    # The VAE's file last, as in a folder: the first broken file a user sees is the same.
    for part in sorted(spec.parts, key=lambda part: part.role == "vae"):
        if part.file is not None:
            value = option(model, flow, part.file.key)
            plans[part.sub] = plan_component(spec, part, value, main)
    checked = CheckedFiles(path, plans, spec, model, flow)
    facts = spec.inspect(checked)
    with offline():
        # Tokenizers first: a broken one fails in a second, not after the weights.
        tokenizers = {t.sub: t.read_files(checked) for t in spec.tokenizers if t.read_files}
        modules = {
            part.sub: _load(plans[part.sub], vae_dtype if part.role == "vae" else weight_dtype)
            for part in spec.parts
        }
    return LoadedFolder(path, facts, modules, tokenizers)


def load_main_file(spec: FamilySpec, path: Path, dtype: torch.dtype) -> torch.nn.Module:
    """The denoiser alone from a main file ``path`` (frozen, on the CPU), as ``load_files``
    reads it: a second denoiser of the same model (another expert's file)."""
    plan = plan_main(spec, open_safetensors(path, WHAT, spec.family))
    with offline():
        return _load(plan, dtype)


def _load(plan: Replacement, dtype: torch.dtype) -> torch.nn.Module:
    module = load_plan(plan, dtype) if isinstance(plan, Plan) else plan(dtype)
    return module.requires_grad_(False).eval()


def plan_main(spec: FamilySpec, file: CheckpointFile) -> Plan:
    """The denoiser's plan from the main file: its keys under the prefix its marks show,
    renamed from the original names (or kept, diffusers'), with the header's config when it
    fits, else the one its shapes show (the main file's ``fixed`` values over either)."""
    part, main = spec.denoiser, spec.main
    label = part.label or f"{spec.family} {part.sub}"
    file.refuse_unreadable(WHAT, main.example)
    found = main.detect(file.keys())
    if found is None:
        raise ModelError(
            f"{file.path} holds no {label} ({sample_keys(file.keys())}); point {WHAT} at "
            f"{main.example} or a diffusers folder"
        )
    layout, prefix = found
    # A full checkpoint's other parts (and keys the module has no place for) stay in the file.
    keys = [
        k
        for k in file
        if k.startswith(prefix) and not k.startswith(main.others)
        and k[len(prefix) :] not in main.dropped
    ]  # fmt: skip
    original = layout == "original"

    def convert(state: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        state = {k[len(prefix) :]: v for k, v in state.items()}
        return main.names.from_original(state) if original else state

    def group(key: str) -> str:
        # each numbered block's fused tensors with its own keys: only one block is held twice
        return main.names.original_group(key, prefix)

    build = main.build or _builder(part)

    def file_name(key: str) -> str:
        return prefix + (main.names.original_key(key) if original else key)

    def plan_of(config: dict) -> Plan:
        return Plan(
            part.sub, WHAT, file, keys, {**config, **main.fixed}, convert, build, group=group,
            label=label, file_name=file_name,
        )  # fmt: skip

    def derive() -> dict:
        try:
            return main.config_from_shapes(convert_shapes(convert, file_shapes(file, keys)))
        except (KeyError, ValueError, IndexError, StopIteration) as exc:
            raise ModelError(f"{file.path}: {one_line(exc)}; it is not a {label}") from None

    return choose_plan(part.sub, plan_of, file, (("derived", derive),))


def file_shapes(file: CheckpointFile, keys: list[str]) -> dict[str, tuple[int, ...]]:
    return {k: file.shape(k) for k in keys}


def _builder(part: SpecPart):
    """A diffusers model class's constructor from a config, the class imported on first use."""

    def build(config: dict) -> torch.nn.Module:
        return Deferred(part.cls).get().from_config(config)

    return build


def plan_component(
    spec: FamilySpec, part: SpecPart, value: str | None, main: CheckpointFile | None = None
) -> Replacement:
    """The replacement of ``part`` from its component file ``value`` (its config key's),
    checked before any weight is read; while the key is unset, the part inside the ``main``
    file where the part may be there. ModelError naming the key when it is unset (and the part
    not inside), missing, a folder (unless the part reads folders) or not the part's file."""
    declared: ComponentFile = part.file
    if not value:
        inside = declared.inside if main is not None else None
        found = inside(main) if inside else None
        if found is not None:
            return found
        needs = (
            f"{main.path} does not hold" if inside
            else f"{spec.family} as a single transformer file needs"
        )  # fmt: skip
        raise ModelError(
            f'{needs} {declared.what}: set {declared.key} = "<path>" in {declared.section} (or '
            f"point {WHAT} at a diffusers folder)"
        )
    path = Path(value).expanduser().absolute()
    if declared.other is not None and path.suffix.lower() != ".safetensors":
        return declared.other(path)
    if declared.folders and path.suffix.lower() != ".safetensors":
        if not path.is_dir():
            raise ModelError(
                f"{declared.key} = {path}: set {declared.key} in {declared.section} to "
                f"{declared.what}"
            )
        model_dir, sub = (
            (path, part.sub) if (path / part.sub).is_dir() else (path.parent, path.name)
        )
        return partial(load_weights, Deferred(part.cls).get(), model_dir, sub)
    if path.is_dir():
        raise ModelError(
            f"{declared.key} = {path} is a folder; set {declared.key} in {declared.section} to "
            f"the .safetensors file of {declared.what}"
        )
    if not path.is_file():
        raise ModelError(
            f"{declared.key} = {path} is not a file (nothing is there); set {declared.key} in "
            f"{declared.section} to {declared.what}"
        )
    return declared.plan(open_safetensors(path, declared.key, spec.family, declared.pickles))


def write_main_file(
    spec: FamilySpec, path: Path, denoiser: torch.nn.Module, metadata, dtype: torch.dtype | None
) -> Path:
    """The trained denoiser alone as the spec's main single file: the original names of its
    name table, one numbered block at a time (the fused tensors of a block exist only while it
    is written), with its diffusers config in the header (``difftune.config.<subfolder>``)
    for exact reloading, before ``metadata``."""
    names = spec.main.names
    blocks = block_groups(denoiser.state_dict(), names.block_groups)
    config = json.dumps(dict(denoiser.config), default=list, sort_keys=True)
    header = {CONFIG_METADATA + spec.denoiser.sub: config, **dict(metadata or {})}
    return save_streamed(path, [(block, names.to_original) for block in blocks], header, dtype)
