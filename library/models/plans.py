"""The one plan system: how a module is built from a weights file, checked before any weight is read.

A ``Plan`` says how one module comes out of one file: the file keys it reads, its config, how
those keys are renamed to the module's (``convert``, which raises ValueError for a key it has no
place for) and the module's class (``build``). ``choose_plan`` tries configs in order: the one
stored in the file's header (``difftune.config.<part>``, written by difftune's exporters), then
the family's candidates (a released config shipped with difftune, a config derived from the
tensor shapes); the first whose module, built on the meta device, holds exactly the file's
tensors (names and shapes) wins. A file that lacks tensors its own header promises while every
tensor it has fits is refused as cut short, never trained as a smaller model. ``load_plan``
then reads, casts, renames and loads the tensors, a group at a time (a transformer block), so
that only one group is held twice.

Every single-file reader uses it: SD's checkpoints (checkpoint_parts.py), a replacement VAE
(vae_file.py), the transformer families' component files (families/file_plans.py) and the
parts a family spec declares (families/spec_loader.py).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import torch

from library.errors import ModelError
from library.models import original_names as names
from library.models.checkpoint_file import CheckpointFile
from library.models.families.shape_origins import converted_origins
from library.models.model_files import one_line, reads_weights

CONFIG_METADATA = "difftune.config."  # + part name: its diffusers config as JSON

Convert = Callable[[Mapping[str, torch.Tensor]], dict[str, torch.Tensor]]
# A config to try: (where it comes from, "shipped" or "derived"; a function making it).
Candidate = tuple[str, Callable[[], dict]]
# What a config cannot be made from: the shapes do not show it.
_UNREADABLE = (ValueError, KeyError, IndexError, StopIteration, TypeError)


@dataclass
class Plan:
    """How to build one module from one file: the keys it reads, its config, the renaming."""

    part: str  # its name in headers (difftune.config.<part>): diffusers' subfolder name
    what: str  # how errors name the file: "clip_l" (-> "clip_l = /x.safetensors"); "": the path
    file: CheckpointFile
    keys: list[str]
    config: dict
    convert: Convert = field(repr=False)
    build: Callable[[dict], torch.nn.Module] = field(repr=False)
    # Convert the keys in groups (by the group name this gives each key), so that only one
    # group's tensors are held twice, and copy the pieces of split tensors; None: all at once.
    group: Callable[[str], str] | None = field(default=None, repr=False)
    label: str = ""  # how errors name the module ("FLUX.1 transformer"); "": the part
    tied: bool = False  # a T5 encoder: shared.weight and encoder.embed_tokens.weight are one
    source: str = "derived"  # which config it has: "metadata", "shipped" or "derived"
    # The file key (as the file spells it) holding a module key, for messages; None: the same.
    file_name: Callable[[str], str] | None = field(default=None, repr=False)

    def spelled(self, key: str) -> str:
        """``key`` of the module, and the file's name for it where that differs."""
        try:
            name = self.file_name(key) if self.file_name else key
        except ValueError:
            name = key
        return key if name == key else f"{key}, the file's {name}"

    @property
    def where(self) -> str:
        """How messages name the file: ``what = path``, or the path."""
        return f"{self.what} = {self.file.path}" if self.what else str(self.file.path)

    @property
    def name(self) -> str:
        """How messages name the module."""
        return self.label or self.part


def empty_module(build: Callable[[dict], torch.nn.Module], config: dict) -> torch.nn.Module:
    """``build(config)`` with its weights on the meta device (shapes only, no memory)."""
    from accelerate import init_empty_weights

    with init_empty_weights():
        return build(config)


def choose_plan(
    part: str, plan_of: Callable[[dict], Plan], file: CheckpointFile,
    candidates: Sequence[Candidate],
) -> Plan:  # fmt: skip
    """The plan with the first config that fits: the file's stored one, else each of
    ``candidates`` in turn (its ``source`` set to where the config came from).

    ModelError when none fits (what the file's own config finds wrong is said over what the
    others find: a tensor whose header entry is wrong may be one the sizes are derived from),
    and when the file lacks tensors its stored config promises while every tensor it has fits:
    the file was cut short (a smaller model derived from the rest would train silently).
    ModelError raised by a candidate (the shapes are not the family's) is raised unless the
    stored config gave a problem to say instead. A file whose weights cannot be read (a
    quantization difftune does not read) is refused first.
    """
    file.refuse_unreadable()
    stored = file.metadata.get(CONFIG_METADATA + part)
    stored_plan, stored_problem = None, None
    if stored:
        try:
            stored_plan = plan_of(json.loads(stored))
            stored_plan.source = "metadata"
            stored_problem = fit_problem(stored_plan)
        except (ValueError, TypeError, KeyError):
            stored_plan = None  # a stale or foreign config: the others decide
        if stored_plan is not None and stored_problem is None:
            return stored_plan
        lacking = lacking_tensors(stored_plan) if stored_plan is not None else []
        if lacking:
            raise ModelError(
                f"{stored_plan.where}: its header ({CONFIG_METADATA}{part}) describes a "
                f"{stored_plan.name} with {len(lacking)} tensors the file does not hold (e.g. "
                f"{stored_plan.spelled(lacking[0])}): the file is truncated; re-download it"
            )
    problem, last = None, None
    for source, make in candidates:
        try:
            plan = plan_of(make())
        except ModelError:
            if stored_problem is None:
                raise
            continue
        except _UNREADABLE as exc:
            problem = problem or f"its sizes cannot be read ({type(exc).__name__}: {exc})"
            continue
        plan.source, last = source, plan
        found = fit_problem(plan)
        if found is None:
            return plan
        problem = found
    where = (stored_plan or last).where if (stored_plan or last) else str(file.path)
    raise ModelError(
        f"{where}: cannot build the {part}: {stored_problem or problem}; re-download or "
        "re-convert it"
    )


def _shapes(plan: Plan) -> tuple[dict, dict, dict]:
    """(the plan's module's tensor shapes, the file's after renaming, the file keys each of
    those was converted from), by module name."""
    module = empty_module(plan.build, plan.config)
    got, origins = converted_origins(plan.convert, file_shapes(plan))
    got = names.fit_text_model_prefix(got, module)
    origins = names.fit_text_model_prefix(origins, module)
    return {k: tuple(v.shape) for k, v in module.state_dict().items()}, got, origins


def file_shapes(plan: Plan) -> dict[str, tuple[int, ...]]:
    """The shapes of the file tensors the plan reads, by file key."""
    return {k: plan.file.shape(k) for k in plan.keys}


def fit_problem(plan: Plan) -> str | None:
    """None when the plan's module holds exactly the file's tensors (names and shapes)."""
    try:
        expected, got, origins = _shapes(plan)
    except (ValueError, TypeError, KeyError, IndexError) as exc:
        return f"cannot build the {plan.part} from it ({one_line(exc)})"
    return shapes_problem(expected, got, plan.name, origins, file_shapes(plan), plan.spelled)


def lacking_tensors(plan: Plan) -> list[str]:
    """The tensors of the plan's module that the file lacks, when every tensor the file has
    fits the module (a file cut short of it); [] otherwise."""
    try:
        expected, got, _ = _shapes(plan)
    except (ValueError, TypeError, KeyError, IndexError):
        return []
    if any(expected.get(k) != tuple(shape) for k, shape in got.items()):
        return []
    return sorted(set(expected) - set(got))


def shapes_problem(
    expected: dict, got: dict, what: str, origins: Mapping[str, tuple[str, ...]] | None = None,
    file_shapes: Mapping[str, tuple[int, ...]] | None = None,
    spelled: Callable[[str], str] = str,
) -> str | None:  # fmt: skip
    """None when ``got`` (name -> shape) has exactly ``expected``'s names and shapes, else why
    not; ``what`` names the module in the message. ``origins``: the file tensors each of
    ``got``'s was converted from (and ``file_shapes`` their shapes), so that a wrong shape is
    blamed on the file's tensor (a fused qkv), not on the piece made of it (to_q);
    ``spelled(key)``: a missing module key with the file's name for it."""
    missing = sorted(set(expected) - set(got))
    if missing:
        example = spelled(missing[0])
        return f"{len(missing)} weights of the {what} are not in the file (e.g. {example})"
    extra = sorted(set(got) - set(expected))
    if extra:
        return f"{len(extra)} tensors of the file do not belong to the {what} (e.g. {extra[0]})"
    for key, shape in expected.items():
        if tuple(got[key]) != tuple(shape):
            sources = (origins or {}).get(key, ())
            if not file_shapes or not sources or sources == (key,):
                return (
                    f"{key} has shape {tuple(got[key])} in the file, the {what} needs "
                    f"{tuple(shape)}"
                )
            found = ", ".join(f"{k} has shape {tuple(file_shapes[k])}" for k in sources)
            return (
                f"{found} in the file, which does not fit the {what}: its {key} would be "
                f"{tuple(got[key])} and needs {tuple(shape)}"
            )
    return None


def unshared(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Copies of the tensors that share storage (pieces of one split fused projection), so
    that every parameter owns its memory: replacing one (a cast, a move to the GPU) then frees
    it, where a view would keep the whole fused tensor alive."""
    seen: dict[int, int] = {}
    for value in state.values():
        ptr = value.untyped_storage().data_ptr()
        seen[ptr] = seen.get(ptr, 0) + 1
    return {
        k: v.clone() if seen[v.untyped_storage().data_ptr()] > 1 else v for k, v in state.items()
    }


def load_plan(plan: Plan, dtype: torch.dtype) -> torch.nn.Module:
    """Read, cast, rename and load the plan's tensors; the module frozen (no gradients, eval
    mode), in ``dtype``. Inside loader.shapes_only(): built on the meta device, nothing read."""
    if not reads_weights():
        module = empty_module(plan.build, plan.config).to(dtype)
        if plan.tied:
            module.tie_weights()
        return module.requires_grad_(False).eval()
    groups: dict[str, list[str]] = {}
    for key in plan.keys:
        groups.setdefault(plan.group(key) if plan.group else "", []).append(key)
    state: dict[str, torch.Tensor] = {}
    for keys in groups.values():
        converted = plan.convert({k: plan.file.tensor(k).to(dtype) for k in keys})
        state.update(unshared(converted) if plan.group else converted)
    module = empty_module(plan.build, plan.config)
    # CLIP keys in the text_model. layout -> the module's own; other modules have no such keys.
    state = names.fit_text_model_prefix(state, module)
    try:
        module.load_state_dict(state, strict=True, assign=True)
    except RuntimeError as exc:  # the shapes were checked; a changed file shows up here
        raise ModelError(f"{plan.where}: {one_line(exc)}") from None
    if plan.tied:
        module.tie_weights()
    floats = [t for t in (*module.parameters(), *module.buffers()) if t.is_floating_point()]
    if any(t.device.type == "meta" for t in floats):
        raise ModelError(f"{plan.where}: some {plan.name} weights were not loaded")
    if any(t.dtype != dtype for t in floats):
        module.to(dtype)
    module.requires_grad_(False)
    module.eval()
    return module
