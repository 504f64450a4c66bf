"""Load difftune or kohya TOML files (plus command-line overrides) into the immutable Config.

Keys live in one flat namespace: top-level keys and the keys of any table are collected (kohya
flattens one level) and routed to their section by name. ``[general]`` and ``[[datasets]]`` are
kohya's dataset schema, resolved with kohya's precedence (see docs/config.md).

Several config files are layers, applied in order with the command line last. Each file is read
and checked on its own (within a file, a key written twice with different values is an error);
across layers a later value replaces an earlier one, and a later empty value (kohya's unset)
clears it. The training data is replaced whole: a layer that gives ``[[datasets]]``,
``train_data_dir`` or ``dataset_config`` drops what earlier layers said about the data (their
``[[datasets]]``, ``[general]``, ``train_data_dir``, ``reg_data_dir``, ``in_json`` and
``dataset_config``). Dataset keys written flat are defaults and layer key by key.
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from pydantic import BaseModel, ValidationError

from library.config import kohya
from library.config.dataset_schema import DatasetConfig, SubsetConfig
from library.config.frontend_keys import FRONTEND_ONLY_KEYS
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
)
from library.config.provenance import DEFAULT, Provenance
from library.config.scheduler_args import unused_notes
from library.config.schema import SECTIONS, Config, field_sections
from library.config.suggest import (
    COMMAND_LINE,
    Origin,
    did_you_mean,
    show_value,
    validation_lines,
)
from library.errors import ConfigError
from library.user_files import read_user_text

# A value and where it was written.
Entry = tuple[object, Origin]

_MODEL_KEY = "pretrained_model_name_or_path"
# Flat keys that give the training images; a layer with one of them (or [[datasets]]) replaces
# the earlier layers' data, these keys and the folders that only go with them included.
_DATA_SOURCE_KEYS = ("train_data_dir", "dataset_config")
_DATA_KEYS = (*_DATA_SOURCE_KEYS, "reg_data_dir", "in_json")

ConfigPaths = str | os.PathLike | Sequence[str | os.PathLike] | None


def read_toml(path: str, what: str = "config file") -> dict:
    """Parse a TOML file; ConfigError naming the file (and line) when it cannot be read or parsed."""
    text = read_user_text(path, what)
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"config error in {path}: not valid TOML: {e}") from None


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


@dataclass
class _Data:
    """The training data after layering: what the last layer that gave data said, plus the
    [general] keys of the layers after it."""

    general: dict[str, Entry]
    inline: list | None
    inline_file: str | None


def load_config(
    config_paths: ConfigPaths, overrides: Sequence[tuple[str, RawValue]] = ()
) -> Config:
    """The resolved, validated, immutable Config of TOML files plus overrides (which win).

    ``config_paths`` is one path or several, applied in order (a later file wins over an
    earlier one, key by key; see the module docstring for the datasets). ``overrides`` are
    ``(key, raw)`` pairs as parse_cli returns them: raw is the text after ``--key``, a list of
    texts (``--network_args a=1 b=2``) or None for a bare ``--flag``.
    Raises ConfigError (or DataError from the folder scan) with one line naming file and key.
    Keys that front ends write and sd-scripts never reads are ignored and listed in
    ``Config.notices``. Where each value came from is in ``provenance(config)``.
    """
    paths = _paths(config_paths)
    layers = [_file_layer(path) for path in paths]
    cli = _command_line_layer(overrides)
    flat, data = _combine([*layers, cli])
    files = _files_text(paths)
    if _MODEL_KEY not in flat:
        if not paths:
            raise ConfigError("no config given: pass --config FILE (a difftune or kohya TOML)")
        raise Origin(files).error(
            f'"{_MODEL_KEY}" is missing: set it to the local folder of a diffusers-format model'
        )
    notices: list[str] = []
    order = {layer.file: i for i, layer in enumerate([*layers, cli])}
    flat = _apply_kohya(flat, notices, order)
    dataset_defaults = {k: flat.pop(k) for k in list(flat) if k in DEFAULT_KEYS}
    sources = {key: _source(origin) for key, (_, origin) in {**flat, **dataset_defaults}.items()}
    sections = _build_sections(flat, files)
    given = {key: (value, origin.file) for key, (value, origin) in flat.items()}
    notices += unused_notes(given, sections["optimizer"].lr_scheduler)
    datasets = _build_datasets(flat, sections, data, files, dataset_defaults, sources)
    try:
        plain = {key: value for key, (value, _) in dataset_defaults.items()}
        config = Config(
            **sections,
            datasets=datasets,
            dataset_defaults=plain,
            notices=_notices(layers) + tuple(notices),
        )
    except ValidationError as exc:  # rules across sections; each field is already valid
        message = "; ".join(e["msg"].removeprefix("Value error, ") for e in exc.errors())
        raise Origin(files).error(message) from None
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


def _source(origin: Origin) -> str:
    return DEFAULT if origin.default else origin.file


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


def _file_layer(path: str) -> _Layer:
    """Read one config file: its flat keys (checked: unknown keys and a key set twice with
    different values are errors), its [general] keys and its [[datasets]] (keys checked)."""
    layer = _Layer(path)
    general: dict = {}
    for name, value in read_toml(path).items():
        if name == "datasets":
            layer.inline = value
        elif name == "general" and isinstance(value, dict):
            general = _split_general(value, layer)
        elif isinstance(value, dict) and name not in field_sections():
            for key, item in value.items():
                _put(layer, key, item, Origin(path, table=name))
        else:
            _put(layer, name, value, Origin(path))
    # a key written "" in one table and set in another is set (kohya flattens the tables)
    layer.unset = {k: o for k, o in layer.unset.items() if k not in layer.flat}
    layer.general = _level(general, Origin(path, path="general"), _UPPER_KEYS, layer.general_unset)
    if layer.inline is not None:
        _check_dataset_keys(layer.inline, path)
    return layer


def _split_general(table: dict, layer: _Layer) -> dict:
    # A flat-args preset may name a table [general]; its non-dataset keys are plain arguments.
    dataset_keys = set(DATASET_KEYS + SUBSET_KEYS)
    general = {}
    for key, value in table.items():
        name = kohya.ALIASES.get(key, key)
        if (key_kind(name) == "flat" and name not in dataset_keys) or name in FRONTEND_ONLY_KEYS:
            _put(layer, key, value, Origin(layer.file, table="general"))
        else:
            general[key] = value
    return general


def _check_dataset_keys(datasets: object, file: str) -> None:
    """Check the keys of every [[datasets]] and [[datasets.subsets]] table of a file, also of
    those a later layer replaces; the datasets used are checked in full by _resolve."""
    if not isinstance(datasets, list):
        return
    for i, raw in enumerate(datasets):
        if not isinstance(raw, dict):
            continue
        _level(_without(raw, "subsets"), Origin(file, path=f"datasets[{i}]"), _UPPER_KEYS)
        subsets = raw.get("subsets")
        for j, sub in enumerate(subsets if isinstance(subsets, list) else []):
            if isinstance(sub, dict):
                _level(sub, Origin(file, path=f"datasets[{i}].subsets[{j}]"), SUBSET_KEYS)


def _typed_value(name: str, value: object) -> object:
    """``value`` as kohya reads it (UNSET for "not set"); see library.config.kohya_values."""
    return normalise(
        name, value, annotation(name) if key_kind(name) in ("flat", "default") else None
    )


def _put(layer: _Layer, key: str, value: object, origin: Origin) -> None:
    name = kohya.ALIASES.get(key, key)
    kind = key_kind(name)
    if kind == "unknown" and name in FRONTEND_ONLY_KEYS:
        layer.ignored.append(name)
        return
    if kind in ("dataset", "unknown"):
        raise origin.error(flat_key_problem(key, origin))
    value = _typed_value(name, value)
    if value is UNSET:
        layer.unset.setdefault(name, origin)
        return
    if name in layer.flat:
        first_value, first = layer.flat[name]
        if kohya.same_value(first_value, value):
            return  # kohya flattens tables: the same value written twice is one setting
        raise origin.error(
            f'"{name}" is set twice with different values: {show_value(first_value)} '
            f"{first.where().strip() or 'at the top level'} and {show_value(value)}"
            f"{origin.where()}; keep one"
        )
    layer.flat[name] = (value, origin)


def _command_line_layer(overrides: Sequence[tuple[str, RawValue]]) -> _Layer:
    """The overrides as the last layer; a key given twice takes its last value."""
    layer = _Layer(COMMAND_LINE)
    origin = Origin(COMMAND_LINE)
    for key, raw in overrides:
        name = kohya.ALIASES.get(key, key)
        if key_kind(name) in ("dataset", "unknown"):
            raise origin.error(flat_key_problem(key, origin))
        value = parse_override(name, raw)
        if value is None:
            raise origin.error(f'option "--{key}" needs a value')
        value = _typed_value(name, value)
        if value is UNSET:  # --vae "" unsets what a file set
            layer.flat.pop(name, None)
            layer.unset[name] = origin
        else:
            layer.unset.pop(name, None)
            layer.flat[name] = (value, origin)
    return layer


def _combine(layers: list[_Layer]) -> tuple[dict[str, Entry], _Data]:
    """Apply the layers in order: a later value replaces an earlier one, a later unset clears
    it, and a layer that gives the training images replaces the earlier layers' data whole."""
    flat: dict[str, Entry] = {}
    data = _Data({}, None, None)
    for layer in layers:
        given = layer.data_sources()
        if len(given) > 1:
            raise Origin(layer.file).error(
                f"{' and '.join(given)} both give the training images; use one"
            )
        if given:
            for key in _DATA_KEYS:
                flat.pop(key, None)
            data = _Data({}, None, None)
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
    flat: dict[str, Entry], notices: list[str], order: dict[str, int]
) -> dict[str, Entry]:
    """Drop "off" unsupported keys (and ignored ones, noting those that are not off), reject
    the others, and expand kohya conveniences. ``order`` ranks the layers by file."""
    out: dict[str, Entry] = {}
    _deepspeed_keys(flat, notices)
    for key, (value, origin) in flat.items():
        if key in kohya.UNSUPPORTED:
            problem = kohya.unsupported_problem(key, value)
            if problem:
                raise origin.error(problem)
            notice = kohya.ignored_notice(key, value)
            if notice:
                notices.append(f"{origin.file}: {notice}")
            continue
        if key == "optimizer_type":
            value = kohya.normalise_optimizer(value)
        problem = kohya.unsupported_value_problem(key, value)
        if problem:
            raise origin.error(problem)
        out[key] = (value, origin)
    _expand_network_args(out, order)
    if "optimizer_args" in out and _is_str_list(out["optimizer_args"][0]):
        value, origin = out["optimizer_args"]
        try:
            kohya.parse_kv_args(value)  # only to report a bad item now; the list is kept
        except ConfigError as e:
            raise origin.error(str(e)) from None
    return out


def _deepspeed_keys(flat: dict[str, Entry], notices: list[str]) -> None:
    """kohya's deepspeed and zero_stage, taken out of ``flat``: as the fsdp they mean."""
    deepspeed, origin = flat.pop("deepspeed", (False, None))
    stage, stage_origin = flat.pop("zero_stage", ("", None))
    fsdp = flat.get("fsdp", (None, None))[0]
    mapped, problem = kohya.deepspeed_to_fsdp(deepspeed, stage, fsdp)
    if problem:
        raise (origin or stage_origin).error(problem)
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


def _is_str_list(value: object) -> bool:
    return isinstance(value, list) and all(isinstance(v, str) for v in value)


def _expand_network_args(out: dict[str, Entry], order: dict[str, int]) -> None:
    if "network_args" not in out or not _is_str_list(out["network_args"][0]):
        return
    items, origin = out["network_args"]
    try:
        values = kohya.network_args_values(items)
    except ConfigError as e:
        raise origin.error(str(e)) from None
    for key, value in values.items():
        value = _typed_value(key, value)
        if value is UNSET:  # e.g. "conv_dim=0": kohya adapts no layer with rank 0
            continue
        if key in out and out[key][0] != value:
            written = out[key][1]
            if order[written.file] > order[origin.file]:
                continue  # a later layer's own key wins over an earlier layer's network_args
            if order[written.file] == order[origin.file]:
                raise origin.error(
                    f"{key} = {show_value(out[key][0])} conflicts with network_args "
                    f'"{key}={value}"; keep one'
                )
        out[key] = (value, origin)


def _validate(model: type[BaseModel], values: dict[str, Entry], fallback: Origin) -> BaseModel:
    """Validate one model; ConfigError naming the file and key of the first problem."""
    plain = {k: v for k, (v, _) in values.items()}
    try:
        return model.model_validate(plain)
    except ValidationError as exc:

        def locate(key: str | None) -> tuple[str, str]:
            if key is None:
                written = {o.file for _, o in values.values() if not o.default}
                files = sorted(written or {fallback.file})
                return " and ".join(files), fallback.path or ""
            origin = values[key][1] if key in values else fallback
            return origin.file, origin.shown(key)

        raise ConfigError(validation_lines(model, exc, locate, plain)) from None


def _build_sections(flat: dict[str, Entry], main_file: str) -> dict[str, BaseModel]:
    owner = field_sections()
    grouped: dict[str, dict[str, Entry]] = {name: {} for name in SECTIONS}
    for key, entry in flat.items():
        grouped[owner[key]][key] = entry
    return {
        name: _validate(model, grouped[name], Origin(main_file)) for name, model in SECTIONS.items()
    }


def _build_datasets(
    flat: dict[str, Entry],
    sections: dict[str, BaseModel],
    data_given: _Data,
    files: str,
    dataset_defaults: dict[str, Entry],
    sources: dict[str, str],
) -> list[DatasetConfig]:
    """Resolve the datasets from the one source left after layering: train_data_dir,
    dataset_config or [[datasets]]; record where each dataset key came from in ``sources``.

    ``dataset_defaults`` are dataset and subset keys written flat (kohya's plain arguments).
    """
    data = sections["data"]
    general, inline = data_given.general, data_given.inline
    if data.reg_data_dir is not None and data.train_data_dir is None:
        raise flat["reg_data_dir"][1].error(
            "reg_data_dir needs train_data_dir; in a dataset config add the folder as a subset "
            "with is_reg = true"
        )
    if data.train_data_dir is None and data.dataset_config is None and inline is None:
        raise Origin(files).error(
            "no training images: set train_data_dir, dataset_config or [[datasets]]"
        )
    if general and data.dataset_config is not None:
        written = next(iter(general.values()))[1].file
        raise Origin(written).error(
            "[general] dataset keys in the config file cannot be combined with dataset_config; "
            "move them into the [general] table of the dataset config"
        )
    defaults = {
        **dataset_defaults,
        "batch_size": _entry(flat, "train_batch_size", sections["training"], files),
        "resolution": _entry(flat, "resolution", data, files),
        "caption_extension": _entry(flat, "caption_extension", data, files),
    }
    if data.dataset_config is not None:
        path = data.dataset_config
        raw_general, inline = _read_dataset_file(path)
        general = _level(raw_general, Origin(path, path="general"), _UPPER_KEYS)
        return _resolve(inline, general, defaults, path, sources)
    if data.train_data_dir is None:
        return _resolve(inline, general, defaults, data_given.inline_file, sources)
    where = flat["train_data_dir"][1]
    if data.in_json is not None:
        subset = {
            "image_dir": data.train_data_dir,
            "metadata_file": data.in_json,
            "num_repeats": data.dataset_repeats,
        }
        inline = [{"subsets": [subset]}]
    else:
        inline = [{"subsets": _folder_subsets(data.train_data_dir, data.reg_data_dir, where)}]
    return _resolve(inline, general, defaults, where.file, sources)


def _entry(flat: dict[str, Entry], key: str, section: BaseModel, files: str) -> Entry:
    # The validated value (schema default when unset) and where the user wrote it.
    origin = flat[key][1] if key in flat else Origin(files, default=True)
    return getattr(section, key), origin


def _read_dataset_file(path: str) -> tuple[dict, list]:
    doc = read_toml(path, "dataset_config file")
    for key in doc:
        if key not in ("general", "datasets"):
            raise Origin(path).error(_not_dataset_key(key, Origin(path)))
    general = doc.get("general", {})
    if not isinstance(general, dict):
        raise Origin(path).error("general must be a table: [general]")
    if not doc.get("datasets"):
        raise Origin(path).error("no [[datasets]] in the dataset config")
    return general, doc["datasets"]


def _folder_subsets(train_dir: str, reg_dir: str | None, origin: Origin) -> list[dict]:
    from library.data.folders import dreambooth_subsets  # lazy: data imports heavier modules

    # A folder named "10" has no class tokens (None): leave the key unset so [general] applies.
    subsets = [
        {k: v for k, v in subset.items() if v is not None}
        for subset in dreambooth_subsets(train_dir, reg_dir)
    ]
    if not subsets:
        raise origin.error(
            f'train_data_dir "{train_dir}" has no "<repeats>_<class tokens>" subfolders'
        )
    return subsets


def _not_dataset_key(key: str, origin: Origin) -> str:
    name = kohya.ALIASES.get(key, key)
    if name in DATASET_KEYS:
        return f'"{name}" is a dataset key; set it in [[datasets]] or [general], not a subset'
    if name in SUBSET_KEYS:
        return f'"{name}" belongs in [[datasets.subsets]]'
    if key_kind(name) == "flat":
        return f'"{name}" is a training argument, not a dataset key; set it in the main config'
    return f'unknown key "{key}"{origin.where()}; {did_you_mean(key, all_key_names())}'


def _level(
    raw: object, origin: Origin, allowed: tuple[str, ...], unset: set[str] | None = None
) -> dict[str, Entry]:
    """The keys of one [general] / [[datasets]] / [[datasets.subsets]] table, checked; the
    keys written with kohya's empty value go into ``unset`` when given."""
    if not isinstance(raw, dict):
        raise origin.error(f"{origin.path} must be a table")
    out: dict[str, Entry] = {}
    for key, value in raw.items():
        name = kohya.ALIASES.get(key, key)
        value = normalise(name, value, _dataset_annotation(name))
        if value is UNSET:
            if unset is not None:
                unset.add(name)
            continue
        if name in kohya.UNSUPPORTED:
            problem = kohya.unsupported_problem(name, value, origin.shown(name))
            if problem:
                raise origin.error(problem)
        elif name not in allowed:
            raise origin.error(_not_dataset_key(key, origin))
        elif name in out:
            raise origin.error(f'"{name}" is set twice{origin.where()}')
        else:
            out[name] = (value, origin)
    return out


def _dataset_annotation(name: str) -> object | None:
    for model in (DatasetConfig, SubsetConfig):
        if name in model.model_fields:
            return model.model_fields[name].annotation
    return None


_UPPER_KEYS = DATASET_KEYS + tuple(
    k for k in SUBSET_KEYS if k not in ("image_dir", "metadata_file")
)


def _resolve(
    datasets: object,
    general: dict[str, Entry],
    defaults: dict[str, Entry],
    file: str,
    sources: dict[str, str],
) -> list[DatasetConfig]:
    """Apply subset > dataset > [general] > flat args > default and validate every dataset.

    ``file`` is where the [[datasets]] tables were written; ``sources`` receives the source of
    every dataset and subset key ("datasets[0].subsets[1].num_repeats").
    """
    if not isinstance(datasets, list) or not datasets:
        raise Origin(file).error("datasets must be a non-empty array of tables: [[datasets]]")
    upper = {**defaults, **general}
    resolved = []
    for i, raw in enumerate(datasets):
        origin = Origin(file, path=f"datasets[{i}]")
        if not isinstance(raw, dict):
            raise origin.error(f"{origin.path} must be a table")
        fields = {**upper, **_level(_without(raw, "subsets"), origin, _UPPER_KEYS)}
        subsets_raw = raw.get("subsets")
        if not isinstance(subsets_raw, list) or not subsets_raw:
            raise origin.error(f"{origin.path} has no subsets: add [[datasets.subsets]] tables")
        subsets = []
        for j, sub in enumerate(subsets_raw):
            sub_origin = Origin(file, path=f"{origin.path}.subsets[{j}]")
            merged = {k: v for k, v in fields.items() if k in SUBSET_KEYS}
            merged.update(_level(sub, sub_origin, SUBSET_KEYS))
            subsets.append(_validate(SubsetConfig, merged, sub_origin))
            _record(sources, sub_origin.path, merged)
        own = {k: v for k, v in fields.items() if k in DATASET_KEYS}
        _record(sources, origin.path, own)
        own["subsets"] = (subsets, origin)
        resolved.append(_validate(DatasetConfig, own, origin))
    return resolved


def _without(table: object, key: str) -> object:
    return {k: v for k, v in table.items() if k != key} if isinstance(table, dict) else table


def _record(sources: dict[str, str], prefix: str, entries: dict[str, Entry]) -> None:
    for key, (_, origin) in entries.items():
        sources[f"{prefix}.{key}"] = _source(origin)
