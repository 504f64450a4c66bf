"""``check``: which keys of a LoRA file a loader would drop or not understand, and why.

Three loaders, each checked against the loaded base model:

- difftune: the trainer's ``network_weights`` import. Every module must name a layer a difftune
  adapter can sit on (a default LoRA's layers with LoCon's convs; LyCORIS' "full" preset for
  LyCORIS files on the families that train them) with tensors of fitting shapes; a file that
  passes is then really imported, into adapters injected with the file's ranks
  (``family.load_lora_tensors``, as library/training/setup.py does).
- diffusers: the family's pipeline runs its own ``load_lora_weights`` on the file (diffusers'
  key conversion, then peft); afterwards each module's weight change in the adapted model is
  compared with the file's. A module diffusers did not load, or loaded with another change, is
  reported with what diffusers logged.
- comfyui: a reproduction of ComfyUI's LoRA key map (comfy/lora.py ``model_lora_keys_unet`` /
  ``model_lora_keys_clip`` and ``load_lora``, read from Comfy-Org/ComfyUI in 2026): which module
  names it accepts for this model and which tensor suffixes it reads under them; every other key
  is one ComfyUI logs as "lora key not loaded". Written from those facts, no ComfyUI code.

Exit status: 0 when no checked loader drops anything, 1 when one does, 2 for bad input.
"""

from __future__ import annotations

import argparse
import logging
import re
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import torch
from torch import nn

from library.errors import CheckpointError, ConfigError, DifftuneError
from library.lora_tools.base_model import (
    DENOISER,
    Layer,
    add_model_arguments,
    default_layers,
    family_group,
    family_label,
    guess_family,
    layer_table,
    load_model,
)
from library.lora_tools.common import KOHYA_LORA, group_modules, module_algorithm, read_file

HELP = (
    "list the keys of a LoRA file that difftune, diffusers or ComfyUI would drop or not "
    "understand, and why (exit 1 if any key is dropped, 0 if none)"
)
LOADERS = ("difftune", "diffusers", "comfyui")
_ADAPTER = "difftune_check"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--lora", required=True, metavar="FILE", help="the LoRA file to check")
    add_model_arguments(parser, {"--model": "the base model the file is meant for"})
    parser.add_argument(
        "--loader",
        choices=(*LOADERS, "all"),
        default="all",
        help="which loader to check against (default all). Exit status: 0 when nothing is "
        "dropped, 1 when some key is, 2 for bad input",
    )


@dataclass
class Report:
    """What one loader does with the file: dropped file key -> why, and notes."""

    loader: str
    dropped: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def drop(self, keys, reason: str) -> None:
        for key in keys:
            self.dropped.setdefault(key, reason)


@dataclass
class FileModules:
    """A file's keys sorted by the model's layers (kohya names), whatever its layout."""

    layout: str
    modules: dict[str, dict[str, torch.Tensor]]  # kohya name -> kohya-layout tensors
    keys: dict[str, list[str]]  # kohya name -> the file's keys of that module
    unknown: list[str]  # file keys that name no layer of the model
    malformed: dict[str, str]  # file key -> why it cannot be read as a module tensor


def run(args: argparse.Namespace) -> int:
    tensors, metadata = read_file(args.lora)
    components = load_model(args, args.model)
    table = layer_table(components)
    found = sort_keys(tensors, metadata, components, table, args.lora)
    chosen = LOADERS if args.loader == "all" else (args.loader,)
    # ComfyUI's check only reads names; the other two inject adapters and take them out again.
    checks: dict[str, Callable[..., Report]] = {
        "comfyui": check_comfyui,
        "difftune": check_difftune,
        "diffusers": check_diffusers,
    }
    label = family_label(components.family)
    print(f"{args.lora}: {len(tensors)} keys ({found.layout} layout), against a {label} model")
    failed = False
    for loader in chosen:
        report = checks[loader](found, tensors, metadata, components, table, args.lora)
        failed |= bool(report.dropped)
        _print(report, len(tensors))
    return 1 if failed else 0


def _print(report: Report, total: int) -> None:
    """The report: every dropped key, under the reason it is dropped for."""
    if not report.dropped:
        print(f"{report.loader}: reads all {total} keys")
    else:
        print(f"{report.loader}: drops {len(report.dropped)} of {total} keys")
        by_reason: dict[str, list[str]] = {}
        for key, reason in report.dropped.items():
            by_reason.setdefault(reason, []).append(key)
        for reason, keys in sorted(by_reason.items(), key=lambda item: sorted(item[1])[0]):
            print(f"  {len(keys)} key{'s' if len(keys) > 1 else ''}: {reason}")
            for key in sorted(keys):
                print(f"    {key}")
    for note in report.notes:
        print(f"  note: {note}")


# -- the file's keys by layer -------------------------------------------------------------------


def sort_keys(tensors, metadata, components, table, source) -> FileModules:
    """The file's keys sorted by module (see FileModules)."""
    from library.lora_tools.convert import (
        comfy_name,
        detect_layout,
        diffusers_component,
        diffusers_path,
        to_kohya,
    )

    layout = detect_layout(tensors, source)
    if layout == "kohya":
        groups = group_modules(tensors)
        known = {n: p for n, p in groups.items() if n in table}
        keys = {n: [f"{n}.{s}" for s in groups[n]] for n in known}
        unknown = sorted(f"{n}.{s}" for n, p in groups.items() if n not in table for s in p)
        return FileModules(layout, known, keys, unknown, {})
    if layout == "comfyui":
        names = {comfy_name(layer, components): name for name, layer in table.items()}
    else:
        names = {
            f"{diffusers_component(layer, components)}.{diffusers_path(layer, i)}": name
            for name, layer in table.items()
            for i in range(len(layer.parts))
        }
    by_module: dict[str, list[str]] = {}
    unknown = []
    for key in tensors:
        prefix = _known_prefix(key, names)
        if prefix is None:
            unknown.append(key)
        else:
            by_module.setdefault(names[prefix], []).append(key)
    modules, malformed = {}, {}
    for keys in by_module.values():
        try:
            kohya, _ = to_kohya({k: tensors[k] for k in keys}, metadata, components, table, source)
        except CheckpointError as exc:
            malformed.update(dict.fromkeys(keys, str(exc).removeprefix(f"{source}: ")))
            continue
        modules.update(group_modules(kohya))
    keys_of = {name: keys for name, keys in by_module.items() if name in modules}
    return FileModules(layout, modules, keys_of, sorted(unknown), malformed)


def _known_prefix(key: str, names: Mapping[str, object]) -> str | None:
    pos = len(key)
    while (pos := key.rfind(".", 0, pos)) > 0:
        if key[:pos] in names:
            return key[:pos]
    return None


def _unknown_reason(found: FileModules, metadata, components) -> str:
    label = family_label(components.family)
    names = [key.split(".", 1)[0] for key in found.unknown]
    guess = guess_family(names, metadata)
    if guess is not None and guess != family_group(components.family):
        return f"names no layer of this {label} model: the file is a LoRA for {guess} models"
    return f"names no layer of this {label} model (a file for another model?)"


# -- difftune -----------------------------------------------------------------------------------


def check_difftune(found: FileModules, tensors, metadata, components, table, source) -> Report:
    """The trainer's network_weights import (library/training/setup.py)."""
    from library.lora_tools.convert import DIFFUSERS_HEADER

    report = Report("difftune")
    family = components.family
    label = family_label(family)
    readable = ("kohya", "diffusers") if "diffusers" in family.lora_formats else ("kohya",)
    if found.layout not in readable:
        report.drop(
            tensors,
            f"network_weights reads {label} files in the {' or '.join(readable)} layout, not "
            f"in the {found.layout} one; convert it with lora_tool.py convert --to kohya",
        )
        return report
    report.drop(found.unknown, _unknown_reason(found, metadata, components))
    for key, reason in found.malformed.items():
        report.drop([key], reason)
    adaptable = set(default_layers(components, conv=True))
    lycoris = (
        _lycoris_layers(components, table) if "lycoris.kohya" in family.network_modules else None
    )
    for name, parts in sorted(found.modules.items()):
        reason = _difftune_module(name, parts, table[name], adaptable, lycoris, label)
        if reason:
            report.drop(found.keys[name], reason)
    if report.dropped:
        return report
    if found.layout == "diffusers" and DIFFUSERS_HEADER in metadata:
        report.notes.append(
            "difftune reads diffusers-layout files at scale 1 (alpha = rank) and ignores the "
            "lora_adapter_metadata header's alphas"
        )
    plain = all(module_algorithm(parts) in KOHYA_LORA for parts in found.modules.values())
    if not plain:
        report.notes.append("LyCORIS file: checked by names and shapes (no trial import)")
        return report
    problem = _trial_import(found, tensors, components, table, source)
    if problem is not None:
        kind, text = problem
        if kind == "note":
            report.notes.append(text)
        else:
            report.drop(tensors, f"the import refuses the file: {text}")
    return report


def _lycoris_layers(components, table) -> set[str]:
    """kohya names of the layers LyCORIS' widest preset ("full") adapts."""
    wanted: dict[int, set[str]] = {}
    family = components.family
    try:
        wanted[DENOISER] = set(family.lycoris_targets(components.denoiser, "unet", "full"))
        for index, encoder in enumerate(components.text_encoders):
            wanted[index] = set(family.lycoris_targets(encoder, "text_encoder", "full"))
    except (NotImplementedError, AttributeError, KeyError):
        return set()
    return {
        name
        for name, layer in table.items()
        if all(path in wanted.get(layer.component, ()) for path in layer.parts)
    }


def _difftune_module(name, parts, layer: Layer, adaptable, lycoris, label) -> str | None:
    algorithm = module_algorithm(parts)
    if algorithm in KOHYA_LORA:
        if name not in adaptable:
            return (
                f"a difftune LoRA has no adapter on this layer (it adapts the {label} "
                "attention/MLP Linears, and 3x3 convs with conv_dim), so network_weights "
                "cannot load it"
            )
    elif lycoris is None:
        return f"a {algorithm} module: difftune reads LyCORIS modules only for SD 1.x/2.x/SDXL"
    elif name not in lycoris:
        return "no LyCORIS preset difftune trains adapts this layer"
    try:
        from library.networks.lycoris import file_math

        file_math.check_shapes(parts, layer.shape)
    except ImportError:
        return _plain_shapes(parts, layer)
    except ValueError as exc:
        return f"does not fit the layer: {exc}"
    return None


def _plain_shapes(parts, layer: Layer) -> str | None:
    down, up = parts.get("lora_down.weight"), parts.get("lora_up.weight")
    if down is None or up is None:
        return "lacks its lora_down or lora_up tensor"
    if up.shape[0] != layer.shape[0] or down[0].numel() != layer.shape[1:].numel():
        return f"down {list(down.shape)} / up {list(up.shape)} do not fit {list(layer.shape)}"
    return None


def _trial_import(found: FileModules, tensors, components, table, source):
    """Inject adapters with the file's ranks on its layers and run family.load_lora_tensors;
    ("error", why) when it refuses, ("note", what) when no trial is possible, else None."""
    from library.lora_tools.convert import split_module
    from library.networks.kohya_keys import UNET
    from library.networks.lora import LoraSpec, apply_lora

    targets: dict[int, dict[str, str]] = {}
    ranks: dict[str, set[int]] = {"linear": set(), "conv": set()}
    for name, parts in found.modules.items():
        layer = table[name]
        alpha = parts.get("alpha")
        pieces, _ = split_module(
            layer,
            parts["lora_down.weight"],
            parts["lora_up.weight"],
            None if alpha is None else float(alpha.float().item()),
        )
        for index, (down, _, _) in enumerate(pieces):
            module = layer.modules[index]
            spatial = isinstance(module, nn.Conv2d) and tuple(module.kernel_size) != (1, 1)
            kind = "conv" if spatial else "linear"
            targets.setdefault(layer.component, {})[layer.parts[index]] = kind
            ranks[kind].add(int(down.shape[0]))
    if any(len(values) > 1 for values in ranks.values()):
        listed = ", ".join(f"{kind} {sorted(values)}" for kind, values in ranks.items() if values)
        return (
            "note",
            f"modules of several ranks ({listed}): network_weights needs one network_dim (and "
            "one conv_dim); resize the file to train on from it",
        )
    dim = next(iter(ranks["linear"] or ranks["conv"]))
    conv = next(iter(ranks["conv"]), None)
    spec = LoraSpec(dim, float(dim), conv, None if conv is None else float(conv))
    family = components.family
    models: dict[str, nn.Module] = {}
    adapted = []
    try:
        for component, paths in sorted(targets.items()):
            model = (
                components.denoiser
                if component == DENOISER
                else (components.text_encoders[component])
            )
            apply_lora(model, paths, spec)
            adapted.append(model)
            prefix = UNET if component == DENOISER else family.text_encoder_lora_prefixes[component]
            models[prefix] = model
        family.load_lora_tensors(models, tensors, str(source))
    except (DifftuneError, ValueError, RuntimeError, KeyError) as exc:
        return ("error", str(exc).removeprefix(f"{source}: "))
    finally:
        for model in adapted:
            _remove_adapters(model)
    return None


def _remove_adapters(model: nn.Module) -> None:
    """Take every peft adapter out of ``model`` again (the base layers go back in place)."""
    from diffusers.utils.peft_utils import recurse_remove_peft_layers

    recurse_remove_peft_layers(model)
    for attr in ("peft_config",):
        if attr in vars(model):
            delattr(model, attr)
    if getattr(model, "_hf_peft_config_loaded", False):
        model._hf_peft_config_loaded = False


# -- diffusers ----------------------------------------------------------------------------------


class _Capture(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def _captured(call: Callable[[], object]) -> tuple[Exception | None, list[str]]:
    """Run ``call``; (the exception it raised or None, what diffusers/peft/transformers warned),
    with their own log output held back (the report says what matters)."""
    handler = _Capture()
    loggers = [logging.getLogger(name) for name in ("diffusers", "peft", "transformers")]
    saved = [(logger.level, logger.handlers[:], logger.propagate) for logger in loggers]
    for logger in loggers:
        logger.handlers = [handler]
        logger.propagate = False
        logger.setLevel(logging.WARNING)
    error = None
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                call()
            except Exception as exc:  # noqa: BLE001 - reported, whatever diffusers raised
                error = exc
    finally:
        for logger, (level, handlers, propagate) in zip(loggers, saved, strict=True):
            logger.handlers = handlers
            logger.propagate = propagate
            logger.setLevel(level)
    messages = handler.messages + [str(w.message) for w in caught]
    return error, [m for m in messages if "lora" in m.lower() or "key" in m.lower()]


def check_diffusers(found: FileModules, tensors, metadata, components, table, source) -> Report:
    """diffusers' own pipeline.load_lora_weights on the file, then each module's change."""
    from library.models.loader import one_line

    report = Report("diffusers")
    pipe = _pipeline(components)
    error, messages = _captured(lambda: pipe.load_lora_weights(str(source), adapter_name=_ADAPTER))
    try:
        if error is not None:
            report.drop(tensors, f"diffusers' load_lora_weights fails: {_failure(error)}")
            return report
        report.drop(found.unknown, _unknown_reason(found, metadata, components))
        for key, reason in found.malformed.items():
            report.drop([key], reason)
        for name, parts in sorted(found.modules.items()):
            reason = _diffusers_module(table[name], parts)
            if reason is None:
                continue
            keys = found.keys[name]
            if reason.startswith("dora:"):
                keys = [k for k in keys if k.endswith("dora_scale")]
                reason = reason.removeprefix("dora:")
            report.drop(keys, reason)
        if report.dropped:
            report.notes += [f"diffusers said: {one_line(Exception(m))}" for m in messages[:3]]
    finally:
        _captured(pipe.unload_lora_weights)
        for model in (components.denoiser, *components.text_encoders):
            _remove_adapters(model)
    return report


def _failure(error: Exception) -> str:
    """An exception in one line, with where it was raised when its message says little."""
    import traceback

    from library.models.loader import one_line

    text = one_line(error)
    frames = traceback.extract_tb(error.__traceback__)
    if frames and len(str(error).strip()) < 20:
        last = frames[-1]
        where = "/".join(last.filename.replace("\\", "/").split("/")[-3:])
        text = f"{type(error).__name__} {str(error).strip()} in {where}, {last.name}()".replace(
            "  ", " "
        )
    return text


def _pipeline(components):
    """The family's diffusers pipeline over the loaded modules (library.sampling)."""
    from diffusers import DDIMScheduler, FlowMatchEulerDiscreteScheduler

    from library.sampling.pipelines import build_pipeline

    flow = components.family.prediction_type == "flow"
    scheduler = (
        FlowMatchEulerDiscreteScheduler()
        if flow
        else DDIMScheduler(steps_offset=1, clip_sample=False, set_alpha_to_one=False)
    )
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return build_pipeline(
                components, components.denoiser, components.text_encoders, scheduler
            )
    except ConfigError as exc:
        raise ConfigError(f"--loader diffusers: {exc}") from None


def _peft_delta(module: nn.Module) -> torch.Tensor | None:
    """The weight change peft's adapter ``_ADAPTER`` makes to ``module`` (None without one)."""
    from peft.tuners.tuners_utils import BaseTunerLayer

    if not isinstance(module, BaseTunerLayer):
        return None
    for attr in ("lora_A", "lokr_w1", "lokr_w1_a", "hada_w1_a"):
        holder = getattr(module, attr, None)
        if holder is not None and _ADAPTER in holder:
            return module.get_delta_weight(_ADAPTER).detach().float()
    return None


def _diffusers_module(layer: Layer, parts) -> str | None:
    """Why diffusers' adapted model does not reproduce a module's change (None if it does)."""
    try:
        from library.networks.lycoris import file_math

        expected = file_math.module_delta(parts, layer.shape)
    except (ImportError, ValueError):
        return None  # nothing to compare with; the difftune check names the problem
    got = [_peft_delta(layer.model.get_submodule(path)) for path in layer.parts]
    if all(delta is None for delta in got):
        return f"diffusers loaded nothing into {', '.join(layer.parts)}"
    if any(delta is None for delta in got):
        missing = [p for p, d in zip(layer.parts, got, strict=True) if d is None]
        return f"diffusers loaded only some parts: nothing into {', '.join(missing)}"
    for path, want, have in zip(layer.parts, layer.split(expected), got, strict=True):
        have = have.reshape(want.shape)
        scale = float(want.abs().max()) or 1.0
        error = float((have - want).abs().max()) / scale
        if error > 1e-3:
            return f"diffusers applies another change to {path} (off by {error:.1%} of its size)"
    if "dora_scale" in parts:
        module = layer.model.get_submodule(layer.parts[0])
        if not getattr(module, "use_dora", {}).get(_ADAPTER, False):
            return "dora:diffusers drops DoRA's dora_scale (the magnitude is not applied)"
    return None


# -- ComfyUI ------------------------------------------------------------------------------------

# CLIP layers ComfyUI maps kohya's lora_te*_ names to (comfy/lora.py LORA_CLIP_MAP).
_CLIP_LAYER = re.compile(
    r"text_model\.encoder\.layers\.(\d+)\.(mlp\.fc1|mlp\.fc2|self_attn\.[qkv]_proj|self_attn\.out_proj)"
)
# (up-like suffix, down-like suffix, extra suffixes) of the LoRA key variants load_lora reads,
# in the order it tries them; the name is followed by "." except for the "_lora." variant.
_LORA_VARIANTS = (
    (".lora_up.weight", ".lora_down.weight", (".lora_mid.weight",)),
    ("_lora.up.weight", "_lora.down.weight", ()),
    (".lora_B.weight", ".lora_A.weight", ()),
    (".lora.up.weight", ".lora.down.weight", ()),
    (".lora_B", ".lora_A", ()),
    (".lora_linear_layer.up.weight", ".lora_linear_layer.down.weight", ()),
    (".lora_B.default.weight", ".lora_A.default.weight", ()),
)
_LOHA = (".hada_w1_a", ".hada_w1_b", ".hada_w2_a", ".hada_w2_b")
_LOKR = (".lokr_w1", ".lokr_w2", ".lokr_w1_a", ".lokr_w1_b", ".lokr_w2_a", ".lokr_w2_b", ".lokr_t2")
_GLORA = (".a1.weight", ".a2.weight", ".b1.weight", ".b2.weight")
_ALWAYS = (".alpha", ".dora_scale", ".diff", ".diff_b", ".set_weight", ".reshape_weight")


def comfy_key_map(components, table) -> dict[str, tuple[Layer, tuple[int, ...] | None]]:
    """The module names ComfyUI's loader accepts for this model -> (layer, the parts of it the
    name stands for; None: all of it)."""
    from library.lora_tools.convert import comfy_clip_names, comfy_name

    kind = type(components.denoiser).__name__
    clips = comfy_clip_names(components)
    key_map: dict[str, tuple[Layer, tuple[int, ...] | None]] = {}
    for layer in table.values():
        whole = (layer, None)
        if layer.component == DENOISER:
            original = comfy_name(layer, components).removeprefix("diffusion_model.")
            key_map["lora_unet_" + original.replace(".", "_")] = whole
            key_map["diffusion_model." + original] = whole
            if kind == "UNet2DConditionModel":
                path = layer.parts[0]
                key_map["lora_unet_" + path.replace(".", "_")] = whole
                key_map["lycoris_" + path.replace(".", "_")] = whole
                attention = path.replace(".to_", ".processor.to_")
                if attention.endswith(".to_out.0"):
                    attention = attention[:-2]
                key_map[attention] = key_map["unet." + attention] = whole
                continue
            for index, path in enumerate(layer.parts):
                flat = path.replace(".", "_")
                names = (
                    ("transformer.", "lycoris_", "lora_transformer_", "")
                    if kind == "FluxTransformer2DModel"
                    else ("transformer.", "base_model.model.", "lora_transformer_", "lycoris_")
                )
                for head in names:
                    key_map[head + (flat if head.endswith("_") else path)] = (layer, (index,))
            if kind == "FluxTransformer2DModel" and original.endswith(".linear1"):
                key_map[f"diffusion_model.{original}_qkv"] = (layer, (0, 1, 2))
            continue
        clip = clips[layer.component]
        path = layer.original
        key_map[f"text_encoders.{clip}.transformer.{path}"] = whole
        if not clip.startswith("clip_"):
            key_map[f"text_encoders.transformer.{path}"] = whole
            index = 1 + ("clip_g" in clips) + ("clip_l" in clips)
            flat = path.replace(".", "_")
            key_map[f"lora_te{index}_{flat}"] = whole
            if index == 2:  # OneTrainer's FLUX.1 T5 names, and kohya's after them
                key_map[f"lora_te3_{flat}"] = whole
            continue
        if path == "text_projection":
            names = {"clip_g": ("lora_prior_te_", "lora_te2_"), "clip_l": ("lora_te1_",)}
            for head in names.get(clip, ()):
                key_map[f"{head}text_projection"] = whole
            continue
        match = _CLIP_LAYER.fullmatch(path)
        if match is None or int(match.group(1)) >= 32:
            continue
        flat = path.replace(".", "_")
        if clip in ("clip_h", "clip_l"):
            heads = ("lora_te_", "lora_te1_")
            key_map[f"text_encoder.{path}"] = whole
        elif "clip_l" in clips:
            heads = ("lora_te2_",)
            key_map[f"text_encoder_2.{path}"] = whole
        else:
            heads = ("lora_te_", "lora_prior_te_")
            key_map[f"text_encoder.{path}"] = whole
        for head in heads:
            key_map[head + flat] = whole
    return key_map


def check_comfyui(found: FileModules, tensors, metadata, components, table, source) -> Report:
    """Which keys ComfyUI's load_lora reads for this model (a reproduction, see the module)."""
    from library.lora_tools.convert import DIFFUSERS_HEADER

    report = Report("comfyui")
    key_map = comfy_key_map(components, table)
    by_name: dict[str, set[str]] = {}
    for key in tensors:
        for name in _comfy_names(key, key_map):
            by_name.setdefault(name, set()).add(key)
    loaded: set[str] = set()
    for name, keys in by_name.items():
        consumed, problem = _comfy_load(name, keys, tensors, key_map[name])
        if problem:
            report.drop(consumed, problem)
        loaded |= consumed
    reason = _unknown_reason(found, metadata, components)
    ours = {key: name for name, keys in found.keys.items() for key in keys}
    for key in tensors:
        if key in loaded or key in report.dropped:
            continue
        if _known_prefix(key, key_map) is not None:
            report.drop([key], "ComfyUI reads no tensor of this name under a known module")
        elif key in ours:
            report.drop(
                [key],
                f"ComfyUI has no module of this name for the layer ({ours[key]}); it does not "
                "read this naming of it (convert the file --to comfyui or --to kohya)",
            )
        else:
            report.drop([key], f"ComfyUI has no such module: {reason}")
    peft = any(key.endswith((".lora_A.weight", ".lora_B.weight")) for key in tensors)
    no_alpha = not any(key.endswith(".alpha") for key in tensors)
    if peft and no_alpha and DIFFUSERS_HEADER in metadata:
        report.notes.append(
            "ComfyUI ignores the lora_adapter_metadata header: it applies every module at "
            "alpha = rank (write the file with convert --fold_alpha for ComfyUI)"
        )
    return report


def _comfy_names(key: str, key_map) -> list[str]:
    """The accepted module names ``key`` is a tensor of (it is ``name`` + a known suffix)."""
    suffixes = [s for variant in _LORA_VARIANTS for s in (variant[0], variant[1], *variant[2])]
    suffixes += [*_LOHA, ".hada_t1", ".hada_t2", *_LOKR, *_GLORA, *_ALWAYS]
    suffixes += [".w_norm", ".b_norm", ".oft_blocks", ".rescale"]
    return [key[: -len(s)] for s in suffixes if key.endswith(s) and key[: -len(s)] in key_map]


def _comfy_load(name: str, keys: set[str], tensors, target) -> tuple[set[str], str | None]:
    """(keys load_lora marks loaded for module ``name``, why they are not applied or None)."""
    consumed = {name + s for s in (".alpha", ".dora_scale") if name + s in keys}
    problem = None
    for up_suffix, down_suffix, extra in _LORA_VARIANTS:
        up_key, down_key = name + up_suffix, name + down_suffix
        if up_key not in keys:
            continue
        consumed.add(up_key)
        if down_key not in tensors:
            return consumed, f"ComfyUI fails on it: {down_key} is missing"
        consumed.add(down_key)
        consumed |= {name + s for s in extra if name + s in keys}
        problem = _comfy_shape(tensors[up_key], tensors[down_key], target)
        break
    if name + ".hada_w1_a" in keys:
        consumed |= {name + s for s in (*_LOHA, ".hada_t1", ".hada_t2") if name + s in keys}
    if any(name + s in keys for s in (".lokr_w1", ".lokr_w2", ".lokr_w1_a", ".lokr_w2_a")):
        consumed |= {name + s for s in _LOKR if name + s in keys}
    if name + ".a1.weight" in keys:
        consumed |= {name + s for s in _GLORA if name + s in keys}
    if name + ".oft_blocks" in keys:
        consumed |= {name + s for s in (".oft_blocks", ".rescale") if name + s in keys}
    if name + ".w_norm" in keys:
        consumed |= {name + s for s in (".w_norm", ".b_norm") if name + s in keys}
    consumed |= {name + s for s in (".diff", ".diff_b", ".set_weight") if name + s in keys}
    return consumed, problem


def _comfy_shape(up: torch.Tensor, down: torch.Tensor, target) -> str | None:
    """Why ComfyUI cannot reshape up @ down to the weight it patches (None when it can)."""
    layer, parts = target
    rows = layer.rows
    out = sum(rows) if parts is None else sum(rows[i] for i in parts)
    shape = (out, *layer.shape[1:])
    ok = up.shape[0] * down.reshape(down.shape[0], -1).shape[1] == torch.Size(shape).numel()
    if not ok or up.reshape(up.shape[0], -1).shape[1] != down.shape[0]:
        return (
            f"ComfyUI logs an error and skips it: up {list(up.shape)} @ down {list(down.shape)} "
            f"does not make the weight's shape {list(shape)}"
        )
    return None
