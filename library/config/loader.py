"""Load difftune or kohya TOML files (plus command-line overrides) into the immutable Config.

Keys live in one flat namespace: top-level keys and the keys of any table are collected (kohya
flattens one level) and routed to their section by name. ``[general]`` and ``[[datasets]]`` are
kohya's dataset schema, resolved with kohya's precedence (library.config.dataset_loader).

Several config files are layers, applied in order with the command line last. Each file is read
and checked on its own (within a file, a key written twice with different values is an error);
across layers a later value replaces an earlier one, and a later empty value (kohya's unset)
clears it. The training data is replaced whole: a layer that gives ``[[datasets]]``,
``train_data_dir`` or ``dataset_config`` drops what earlier layers said about the data (their
``[[datasets]]``, ``[general]``, ``train_data_dir``, ``reg_data_dir``, ``in_json`` and
``dataset_config``). Dataset keys written flat are defaults and layer key by key; given on the
command line they win over the dataset tables too (library.config.dataset_loader).

Every problem of the files is collected and refused in one error (library.config.problems).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from pydantic import BaseModel, ValidationError

from library.config import kohya
from library.config.dataset_loader import (
    UPPER_KEYS,
    DataGiven,
    DatasetInputs,
    build_datasets,
    check_dataset_keys,
    table_keys,
)
from library.config.frontend_keys import FRONTEND_ONLY_KEYS
from library.config.kohya_script_keys import full_fine_tune_problem
from library.config.kohya_values import UNSET, normalise
from library.config.overrides import (
    DATASET_KEYS,
    DEFAULT_KEYS,
    SUBSET_KEYS,
    RawValue,
    all_key_names,
    annotation,
    flat_key_problem,
    key_kind,
    parse_override,
    takes_table,
)
from library.config.problems import (
    Entry,
    Problems,
    involved,
    source_of,
    sources_note,
    validate,
)
from library.config.provenance import Provenance
from library.config.scheduler_args import unused_notes
from library.config.schema import SECTIONS, Config, field_sections
from library.config.suggest import COMMAND_LINE, Origin, near_miss, show_value
from library.config.toml_files import read_toml
from library.errors import ConfigError

_MODEL_KEY = "pretrained_model_name_or_path"
# Flat keys that give the training images; a layer with one of them (or [[datasets]]) replaces
# the earlier layers' data, these keys and the folders that only go with them included.
_DATA_SOURCE_KEYS = ("train_data_dir", "dataset_config")
_DATA_KEYS = (*_DATA_SOURCE_KEYS, "reg_data_dir", "in_json")
# kohya turns sampling off, with a warning, when these are negative (0 is off here too).
_SAMPLE_CADENCES = ("sample_every_n_steps", "sample_every_n_epochs")
_TEXT_CACHE_KEYS = ("cache_text_encoder_outputs", "cache_text_encoder_outputs_to_disk")
# sd-scripts' deprecated Flux.1 switch: it sets blocks_to_swap to this when that is unset.
_SPLIT_MODE_BLOCKS = 18

ConfigPaths = str | os.PathLike | Sequence[str | os.PathLike] | None


@dataclass
class _Layer:
    """What one config file, or the command line, says before the layers are combined."""

    file: str
    flat: dict[str, Entry] = field(default_factory=dict)
    unset: dict[str, Origin] = field(default_factory=dict)  # keys it clears ("" and the like)
    general: dict[str, Entry] = field(default_factory=dict)  # its [general] dataset keys
    general_unset: set[str] = field(default_factory=set)
    inline: list | None = None  # its [[datasets]], as written
    ignored: list[str] = field(default_factory=list)  # keys only front ends write

    def data_sources(self) -> list[str]:
        given = [k for k in _DATA_SOURCE_KEYS if k in self.flat]
        return given + (["[[datasets]]"] if self.inline is not None else [])


def load_config(
    config_paths: ConfigPaths,
    overrides: Sequence[tuple[str, RawValue]] = (),
    ignore_unknown_keys: bool = False,
) -> Config:
    """The resolved, validated, immutable Config of TOML files plus overrides (which win).

    ``config_paths`` is one path or several, applied in order (a later file wins over an
    earlier one, key by key; see the module docstring for the datasets). ``overrides`` are
    ``(key, raw)`` pairs as parse_cli returns them: raw is the text after ``--key``, a list of
    texts (``--network_args a=1 b=2``) or None for a bare ``--flag``.
    Raises ConfigError naming every problem of the files at once (or DataError from the folder
    scan). Keys that front ends write and sd-scripts never reads are ignored and listed in
    ``Config.notices``; so are keys no tool defines when ``ignore_unknown_keys`` is true.
    Where each value came from is in ``provenance(config)``.
    """
    paths = _paths(config_paths)
    problems = Problems(ignore_unknown=ignore_unknown_keys)
    layers = [_file_layer(path, problems) for path in paths]
    cli = _command_line_layer(overrides, problems)
    flat, data = _combine([*layers, cli], problems)
    files = _files_text(paths)
    notices: list[str] = list(_notices(layers))
    if _MODEL_KEY not in flat:
        if not paths:
            raise ConfigError("no config given: pass --config FILE (a difftune or kohya TOML)")
        problems.add(
            Origin(files),
            f'"{_MODEL_KEY}" is missing: set it to the local folder of a diffusers-format model',
            _MODEL_KEY,
        )
    order = {layer.file: i for i, layer in enumerate([*layers, cli])}
    flat = _apply_kohya(flat, notices, order, problems)
    _frozen_text_default(flat, files)
    dataset_defaults = {k: flat.pop(k) for k in list(flat) if k in DEFAULT_KEYS}
    sources = {key: source_of(o) for key, (_, o) in {**flat, **dataset_defaults}.items()}
    sections = _build_sections(flat, files, problems)
    problems.raise_if_any()
    given = {key: (value, origin.file) for key, (value, origin) in flat.items()}
    notices += unused_notes(given, sections["optimizer"].lr_scheduler)
    inputs = DatasetInputs(flat, sections, files, dataset_defaults, sources, problems, notices)
    datasets = build_datasets(data, inputs)
    problems.raise_if_any()
    notices += problems.ignored_notices()
    try:
        plain = {key: value for key, (value, _) in dataset_defaults.items()}
        config = Config(
            **sections, datasets=datasets, dataset_defaults=plain, notices=tuple(notices)
        )
    except ValidationError as exc:  # rules across sections; each field is already valid
        message = "; ".join(e["msg"].removeprefix("Value error, ") for e in exc.errors())
        layers = involved(message, sources, files)  # the layers that set the keys in conflict
        raise Origin(layers).error(message + sources_note(message, sources, layers)) from None
    given = (kohya.ALIASES.get(key, key) for key, _ in overrides)
    config._provenance = Provenance(tuple(paths), tuple(dict.fromkeys(given)), sources)
    return config


def _paths(config_paths: ConfigPaths) -> list[str]:
    if config_paths is None:
        return []
    if isinstance(config_paths, (str, os.PathLike)):
        config_paths = [config_paths]
    return [_with_toml_suffix(os.fspath(path)) for path in config_paths]


def _files_text(paths: list[str]) -> str:
    """The config files for a message that concerns all of them: "a.toml and b.toml"."""
    return " and ".join(dict.fromkeys(paths)) or COMMAND_LINE


def _with_toml_suffix(path: str) -> str:
    """kohya reads ``--config_file preset`` as preset.toml: do the same when only that exists."""
    if not path.endswith(".toml") and not Path(path).exists() and Path(path + ".toml").is_file():
        return path + ".toml"
    return path


def _notices(layers: list[_Layer]) -> tuple[str, ...]:
    ignored: dict[str, list[str]] = {}
    for layer in layers:
        ignored.setdefault(layer.file, []).extend(layer.ignored)
    lines = []
    for file, keys in ignored.items():
        if not keys:
            continue
        keys = list(dict.fromkeys(keys))
        tools = sorted({FRONTEND_ONLY_KEYS[k] for k in keys})
        lines.append(
            f"{file}: ignored {', '.join(keys)}: written by {' and '.join(tools)} and not read by "
            "sd-scripts either"
        )
    return tuple(lines)


def _file_layer(path: str, problems: Problems) -> _Layer:
    """Read one config file: its flat keys (unknown keys and a key set twice with different
    values go to ``problems``), its [general] keys and its [[datasets]] (keys checked)."""
    layer = _Layer(path)
    general: dict = {}
    for name, value in read_toml(path).items():
        if name == "datasets":
            layer.inline = value
        elif name == "general" and isinstance(value, dict):
            general = _split_general(value, layer, problems)
        elif isinstance(value, dict) and not takes_table(name):
            # a group of keys, even one named like a key ([dataset_config] in GUI files)
            for key, item in value.items():
                _put(layer, key, item, Origin(path, table=name), problems)
        else:
            _put(layer, name, value, Origin(path), problems)
    # a key written "" in one table and set in another is set (kohya flattens the tables)
    layer.unset = {k: o for k, o in layer.unset.items() if k not in layer.flat}
    origin = Origin(path, path="general")
    layer.general = table_keys(general, origin, UPPER_KEYS, problems, layer.general_unset)
    if layer.inline is not None:
        check_dataset_keys(layer.inline, path, problems)
    return layer


def _split_general(table: dict, layer: _Layer, problems: Problems) -> dict:
    # A flat-args preset may name a table [general]; its non-dataset keys are plain arguments.
    dataset_keys = set(DATASET_KEYS + SUBSET_KEYS)
    general = {}
    for key, value in table.items():
        name = kohya.ALIASES.get(key, key)
        if (key_kind(name) == "flat" and name not in dataset_keys) or name in FRONTEND_ONLY_KEYS:
            _put(layer, key, value, Origin(layer.file, table="general"), problems)
        else:
            general[key] = value
    return general


def _typed_value(name: str, value: object) -> object:
    """``value`` as kohya reads it (UNSET for "not set"); see library.config.kohya_values."""
    return normalise(
        name, value, annotation(name) if key_kind(name) in ("flat", "default") else None
    )


def _put(layer: _Layer, key: str, value: object, origin: Origin, problems: Problems) -> None:
    name = kohya.ALIASES.get(key, key)
    kind = key_kind(name)
    if kind == "unknown" and name in FRONTEND_ONLY_KEYS:
        layer.ignored.append(name)
        return
    if kind == "unknown":
        near = near_miss(key, all_key_names())
        problems.add_unknown(origin, flat_key_problem(key, origin), key, near)
        return
    if kind == "dataset":
        problems.add(origin, flat_key_problem(key, origin), key)
        return
    value = _typed_value(name, value)
    if value is UNSET:
        layer.unset.setdefault(name, origin)
        return
    if name in layer.flat:
        first_value, first = layer.flat[name]
        if kohya.same_value(first_value, value):
            return  # kohya flattens tables: the same value written twice is one setting
        problems.add(
            origin,
            f'"{name}" is set twice with different values: {show_value(first_value)} '
            f"{first.where().strip() or 'at the top level'} and {show_value(value)}"
            f"{origin.where()}; keep one",
            name,
        )
        return
    layer.flat[name] = (value, origin)


def _command_line_layer(overrides: Sequence[tuple[str, RawValue]], problems: Problems) -> _Layer:
    """The overrides as the last layer; a key given twice takes its last value."""
    layer = _Layer(COMMAND_LINE)
    origin = Origin(COMMAND_LINE)
    for key, raw in overrides:
        name = kohya.ALIASES.get(key, key)
        if key_kind(name) in ("dataset", "unknown"):
            # never an "unknown key" that --ignore_unknown_keys drops: a typed option is meant
            problems.add(origin, flat_key_problem(key, origin), key)
            continue
        value = parse_override(name, raw)
        if value is None:
            problems.add(origin, f'option "--{key}" needs a value', key)
            continue
        value = _typed_value(name, value)
        if value is UNSET:  # --vae "" unsets what a file set
            layer.flat.pop(name, None)
            layer.unset[name] = origin
        else:
            layer.unset.pop(name, None)
            layer.flat[name] = (value, origin)
    return layer


def _combine(layers: list[_Layer], problems: Problems) -> tuple[dict[str, Entry], DataGiven]:
    """Apply the layers in order: a later value replaces an earlier one, a later unset clears
    it, and a layer that gives the training images replaces the earlier layers' data whole."""
    flat: dict[str, Entry] = {}
    data = DataGiven({}, None, None)
    for layer in layers:
        given = layer.data_sources()
        if len(given) > 1:
            problems.add(
                Origin(layer.file), f"{' and '.join(given)} both give the training images; use one"
            )
        if given:
            for key in _DATA_KEYS:
                flat.pop(key, None)
            data = DataGiven({}, None, None)
        for key in layer.unset:
            flat.pop(key, None)
        flat.update(layer.flat)
        for key in layer.general_unset:
            data.general.pop(key, None)
        data.general.update(layer.general)
        if layer.inline is not None:
            data.inline, data.inline_file = layer.inline, layer.file
    return flat, data


def _apply_kohya(
    flat: dict[str, Entry], notices: list[str], order: dict[str, int], problems: Problems
) -> dict[str, Entry]:
    """Drop "off" unsupported keys (and ignored ones, noting those that are not off), report
    the others, and expand kohya conveniences. ``order`` ranks the layers by file."""
    out: dict[str, Entry] = {}
    full_fine_tune = full_fine_tune_problem({key: value for key, (value, _) in flat.items()})
    if full_fine_tune:
        sources = {key: source_of(origin) for key, (_, origin) in flat.items()}
        layers = involved(full_fine_tune, sources, _files_of(flat, order))
        problems.add(Origin(layers), full_fine_tune, "train_mode")
    _deepspeed_keys(flat, notices, problems)
    _split_mode(flat, notices)
    for key, (value, origin) in flat.items():
        if key in kohya.UNSUPPORTED:
            problem = kohya.unsupported_problem(key, value)
            if problem:
                problems.add(origin, problem, key)
            notice = kohya.ignored_notice(key, value)
            if notice:
                notices.append(f"{origin.file}: {notice}")
            continue
        if key == "optimizer_type":
            value = kohya.normalise_optimizer(value)
        problem = kohya.unsupported_value_problem(key, value)
        if problem:
            problems.add(origin, problem, key)
            continue
        if key in _SAMPLE_CADENCES and _is_number(value) and value < 0:
            notices.append(f"{origin.file}: {key} = {value} turns sampling off, as in sd-scripts")
            continue
        out[key] = (value, origin)
    _expand_network_args(out, order, problems)
    if "optimizer_args" in out and _is_str_list(out["optimizer_args"][0]):
        value, origin = out["optimizer_args"]
        try:
            kohya.parse_kv_args(value)  # only to report a bad item now; the list is kept
        except ConfigError as e:
            problems.add(origin, str(e), "optimizer_args")
            del out["optimizer_args"]  # reported; the section check would say it again
    return out


def _files_of(flat: dict[str, Entry], order: dict[str, int]) -> str:
    """The files (in layer order) the keys of ``flat`` come from, for a message about them all
    that names none of them."""
    files = sorted({origin.file for _, origin in flat.values()}, key=order.__getitem__)
    return " and ".join(files)


def _frozen_text_default(flat: dict[str, Entry], files: str) -> None:
    """Cached text-encoder outputs leave the text encoders frozen: there an unset
    network_train_unet_only means true (the LoRA adapts the denoiser), not kohya's false, which
    the cache cannot honour. Written false, the schema's check refuses the pair."""
    if "network_train_unet_only" in flat:
        return
    if any(flat.get(key, (False, None))[0] is True for key in _TEXT_CACHE_KEYS):
        flat["network_train_unet_only"] = (True, Origin(files, default=True))


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _deepspeed_keys(flat: dict[str, Entry], notices: list[str], problems: Problems) -> None:
    """kohya's deepspeed and zero_stage, taken out of ``flat``: as the fsdp they mean."""
    deepspeed, origin = flat.pop("deepspeed", (False, None))
    stage, stage_origin = flat.pop("zero_stage", ("", None))
    fsdp = flat.get("fsdp", (None, None))[0]
    mapped, problem = kohya.deepspeed_to_fsdp(deepspeed, stage, fsdp)
    if problem:
        where = origin or stage_origin
        problems.add(where, problem, "deepspeed" if origin else "zero_stage")
        return
    if mapped is None:
        if stage_origin is not None and stage not in ("", kohya.KOHYA_ZERO_STAGE):
            notices.append(
                f"{stage_origin.file}: zero_stage is ignored: it only acts with deepspeed = true"
            )
        return
    flat["fsdp"] = (mapped, origin)
    shown = f"zero_stage = {stage}" if stage_origin else f"zero_stage {kohya.KOHYA_ZERO_STAGE}"
    notices.append(
        f"{origin.file}: deepspeed = true ({shown}) trains with PyTorch's FSDP2 sharding: "
        f'fsdp = "{mapped}"'
    )


def _split_mode(flat: dict[str, Entry], notices: list[str]) -> None:
    """sd-scripts' deprecated split_mode, taken out of ``flat``: as sd-scripts reads it, the
    block swap of 18 blocks when blocks_to_swap is unset, else nothing (with its warning)."""
    value, origin = flat.pop("split_mode", (False, None))
    if value is not True:
        if origin is not None and value is not False:
            flat["split_mode"] = (value, origin)  # not true or false: the schema check names it
        return
    if "blocks_to_swap" in flat:
        notices.append(
            f"{origin.file}: split_mode is ignored because blocks_to_swap is set, as in "
            "sd-scripts (split_mode is deprecated there)"
        )
        return
    flat["blocks_to_swap"] = (_SPLIT_MODE_BLOCKS, origin)
    notices.append(
        f"{origin.file}: split_mode = true means blocks_to_swap = {_SPLIT_MODE_BLOCKS}, as in "
        "sd-scripts (split_mode is deprecated there; write blocks_to_swap)"
    )


def _is_str_list(value: object) -> bool:
    return isinstance(value, list) and all(isinstance(v, str) for v in value)


def _expand_network_args(out: dict[str, Entry], order: dict[str, int], problems: Problems) -> None:
    if "network_args" not in out or not _is_str_list(out["network_args"][0]):
        return
    items, origin = out["network_args"]
    try:
        values = kohya.network_args_values(items)
    except ConfigError as e:
        problems.add(origin, str(e), "network_args")
        return
    for key, value in values.items():
        value = _typed_value(key, value)
        if value is UNSET:  # e.g. "conv_dim=0": kohya adapts no layer with rank 0
            continue
        if key in out and out[key][0] != value:
            written = out[key][1]
            if order[written.file] > order[origin.file]:
                continue  # a later layer's own key wins over an earlier layer's network_args
            if order[written.file] == order[origin.file]:
                problems.add(
                    origin,
                    f"{key} = {show_value(out[key][0])} conflicts with network_args "
                    f'"{key}={value}"; keep one',
                    key,
                )
                continue
        out[key] = (value, origin)


def _build_sections(
    flat: dict[str, Entry], files: str, problems: Problems
) -> dict[str, BaseModel | None]:
    """Every section validated (None where it has problems, added to ``problems``)."""
    owner = field_sections()
    grouped: dict[str, dict[str, Entry]] = {name: {} for name in SECTIONS}
    for key, entry in flat.items():
        grouped[owner[key]][key] = entry
    sections: dict[str, BaseModel | None] = {}
    for name, model in SECTIONS.items():
        if name == "model" and _MODEL_KEY not in flat:
            sections[name] = None  # already reported, with the fix
            continue
        sections[name] = validate(model, grouped[name], Origin(files), problems)
    return sections
