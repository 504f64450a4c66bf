"""Load a difftune or kohya TOML (plus command-line overrides) into the immutable Config.

Keys live in one flat namespace: top-level keys and the keys of any table are collected (kohya
flattens one level) and routed to their section by name. ``[general]`` and ``[[datasets]]`` are
kohya's dataset schema, resolved with kohya's precedence (see docs/config.md).
"""

from __future__ import annotations

import tomllib
from collections.abc import Sequence
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


def read_toml(path: str, what: str = "config file") -> dict:
    """Parse a TOML file; ConfigError naming the file (and line) when it cannot be read or parsed."""
    text = read_user_text(path, what)
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"config error in {path}: not valid TOML: {e}") from None


def load_config(config_path: str | None, overrides: Sequence[tuple[str, RawValue]] = ()) -> Config:
    """The resolved, validated, immutable Config of a TOML file plus overrides (which win).

    ``overrides`` are ``(key, raw)`` pairs as parse_cli returns them: raw is the text after
    ``--key``, a list of texts (``--network_args a=1 b=2``) or None for a bare ``--flag``.
    Raises ConfigError (or DataError from the folder scan) with one line naming file and key.
    Keys that front ends write and sd-scripts never reads are ignored and listed in
    ``Config.notices``.
    """
    flat: dict[str, Entry] = {}
    general: dict = {}
    inline: list | None = None
    ignored: dict[str, list[str]] = {}
    if config_path is not None:
        config_path = _with_toml_suffix(config_path)
        general, inline = _split_args_file(read_toml(config_path), config_path, flat, ignored)
    _apply_overrides(flat, overrides)
    if _MODEL_KEY not in flat:
        if config_path is None:
            raise ConfigError("no config given: pass --config FILE (a difftune or kohya TOML)")
        raise Origin(config_path).error(
            f'"{_MODEL_KEY}" is missing: set it to the local folder of a diffusers-format model'
        )
    notices: list[str] = []
    flat = _apply_kohya(flat, notices)
    main_file = config_path or COMMAND_LINE
    dataset_defaults = {k: flat.pop(k) for k in list(flat) if k in DEFAULT_KEYS}
    sections = _build_sections(flat, main_file)
    datasets = _build_datasets(flat, sections, general, inline, main_file, dataset_defaults)
    try:
        plain = {key: value for key, (value, _) in dataset_defaults.items()}
        return Config(
            **sections, datasets=datasets, dataset_defaults=plain, notices=_notices(ignored) + tuple(notices)
        )
    except ValidationError as exc:  # rules across sections; each field is already valid
        message = "; ".join(e["msg"].removeprefix("Value error, ") for e in exc.errors())
        raise Origin(main_file).error(message) from None


def _with_toml_suffix(path: str) -> str:
    """kohya reads ``--config_file preset`` as preset.toml: do the same when only that exists."""
    if not path.endswith(".toml") and not Path(path).exists() and Path(path + ".toml").is_file():
        return path + ".toml"
    return path


def _notices(ignored: dict[str, list[str]]) -> tuple[str, ...]:
    lines = []
    for file, keys in ignored.items():
        tools = sorted({FRONTEND_ONLY_KEYS[k] for k in keys})
        lines.append(
            f"{file}: ignored {', '.join(keys)}: written by {' and '.join(tools)} and not read by "
            "sd-scripts either"
        )
    return tuple(lines)


def _split_args_file(
    doc: dict, file: str, flat: dict[str, Entry], ignored: dict[str, list[str]]
) -> tuple[dict, list | None]:
    """Collect the flat keys of an args file into ``flat``; return its [general] and datasets.

    Front-end-only keys are collected in ``ignored[file]`` instead.
    """
    general: dict = {}
    inline = None
    for name, value in doc.items():
        if name == "datasets":
            inline = value
        elif name == "general" and isinstance(value, dict):
            general = _split_general(value, file, flat, ignored)
        elif isinstance(value, dict) and name not in field_sections():
            for key, item in value.items():
                _put(flat, key, item, Origin(file, table=name), ignored)
        else:
            _put(flat, name, value, Origin(file), ignored)
    return general, inline


def _split_general(
    table: dict, file: str, flat: dict[str, Entry], ignored: dict[str, list[str]]
) -> dict:
    # A flat-args preset may name a table [general]; its non-dataset keys are plain arguments.
    dataset_keys = set(DATASET_KEYS + SUBSET_KEYS)
    general = {}
    for key, value in table.items():
        name = kohya.ALIASES.get(key, key)
        if (key_kind(name) == "flat" and name not in dataset_keys) or name in FRONTEND_ONLY_KEYS:
            _put(flat, key, value, Origin(file, table="general"), ignored)
        else:
            general[key] = value
    return general


def _typed_value(name: str, value: object) -> object:
    """``value`` as kohya reads it (UNSET for "not set"); see library.config.kohya_values."""
    return normalise(name, value, annotation(name) if key_kind(name) in ("flat", "default") else None)


def _put(
    flat: dict[str, Entry],
    key: str,
    value: object,
    origin: Origin,
    ignored: dict[str, list[str]],
) -> None:
    name = kohya.ALIASES.get(key, key)
    kind = key_kind(name)
    if kind == "unknown" and name in FRONTEND_ONLY_KEYS:
        ignored.setdefault(origin.file, []).append(name)
        return
    if kind in ("dataset", "unknown"):
        raise origin.error(flat_key_problem(key, origin))
    value = _typed_value(name, value)
    if value is UNSET:
        return
    if name in flat:
        first_value, first = flat[name]
        if kohya.same_value(first_value, value):
            return  # kohya flattens tables: the same value written twice is one setting
        raise origin.error(
            f'"{name}" is set twice with different values: {show_value(first_value)} '
            f"{first.where().strip() or 'at the top level'} and {show_value(value)}"
            f"{origin.where()}; keep one"
        )
    flat[name] = (value, origin)


def _apply_overrides(flat: dict[str, Entry], overrides: Sequence[tuple[str, RawValue]]) -> None:
    origin = Origin(COMMAND_LINE)
    for key, raw in overrides:
        name = kohya.ALIASES.get(key, key)
        if key_kind(name) in ("dataset", "unknown"):
            raise origin.error(flat_key_problem(key, origin))
        value = parse_override(name, raw)
        if value is None:
            raise origin.error(f'option "--{key}" needs a value')
        value = _typed_value(name, value)
        if value is UNSET:  # --vae "" unsets what the file set
            flat.pop(name, None)
        else:
            flat[name] = (value, origin)


def _apply_kohya(flat: dict[str, Entry], notices: list[str]) -> dict[str, Entry]:
    """Drop "off" unsupported keys (and ignored ones, noting those that are not off), reject
    the others, and expand kohya conveniences."""
    out: dict[str, Entry] = {}
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
    _expand_network_args(out)
    if "optimizer_args" in out and _is_str_list(out["optimizer_args"][0]):
        value, origin = out["optimizer_args"]
        try:
            kohya.parse_kv_args(value)  # only to report a bad item now; the list is kept
        except ConfigError as e:
            raise origin.error(str(e)) from None
    return out


def _is_str_list(value: object) -> bool:
    return isinstance(value, list) and all(isinstance(v, str) for v in value)


def _expand_network_args(out: dict[str, Entry]) -> None:
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
                files = sorted({o.file for _, o in values.values()} or {fallback.file})
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
    general: dict,
    inline: list | None,
    main_file: str,
    dataset_defaults: dict[str, Entry],
) -> list[DatasetConfig]:
    """Resolve the datasets from exactly one source: train_data_dir, dataset_config or inline.

    ``dataset_defaults`` are dataset and subset keys written flat (kohya's plain arguments).
    """
    data = sections["data"]
    given = [k for k in ("train_data_dir", "dataset_config") if getattr(data, k) is not None]
    where = flat[given[0]][1] if given else Origin(main_file)
    if inline is not None:
        given.append("[[datasets]]")
    if len(given) > 1:
        raise where.error(f"{' and '.join(given)} both give the training images; use one")
    if data.reg_data_dir is not None and data.train_data_dir is None:
        raise flat["reg_data_dir"][1].error(
            "reg_data_dir needs train_data_dir; in a dataset config add the folder as a subset "
            "with is_reg = true"
        )
    if not given:
        raise where.error("no training images: set train_data_dir, dataset_config or [[datasets]]")
    if general and data.dataset_config is not None:
        raise Origin(main_file).error(
            "[general] dataset keys in the config file cannot be combined with dataset_config; "
            "move them into the [general] table of the dataset config"
        )
    defaults = {
        **dataset_defaults,
        "batch_size": _entry(flat, "train_batch_size", sections["training"], main_file),
        "resolution": _entry(flat, "resolution", data, main_file),
        "caption_extension": _entry(flat, "caption_extension", data, main_file),
    }
    if data.dataset_config is not None:
        general, inline = _read_dataset_file(data.dataset_config)
        return _resolve(inline, general, defaults, data.dataset_config)
    if data.in_json is not None:
        subset = {
            "image_dir": data.train_data_dir,
            "metadata_file": data.in_json,
            "num_repeats": data.dataset_repeats,
        }
        inline = [{"subsets": [subset]}]
    elif data.train_data_dir is not None:
        inline = [{"subsets": _folder_subsets(data.train_data_dir, data.reg_data_dir, where)}]
    return _resolve(inline, general, defaults, main_file)


def _entry(flat: dict[str, Entry], key: str, section: BaseModel, main_file: str) -> Entry:
    # The validated value (schema default when unset) and where the user wrote it.
    origin = flat[key][1] if key in flat else Origin(main_file)
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


def _level(raw: object, origin: Origin, allowed: tuple[str, ...]) -> dict[str, Entry]:
    """The keys of one [general] / [[datasets]] / [[datasets.subsets]] table, checked."""
    if not isinstance(raw, dict):
        raise origin.error(f"{origin.path} must be a table")
    out: dict[str, Entry] = {}
    for key, value in raw.items():
        name = kohya.ALIASES.get(key, key)
        value = normalise(name, value, _dataset_annotation(name))
        if value is UNSET:
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
    datasets: object, general: dict, defaults: dict[str, Entry], file: str
) -> list[DatasetConfig]:
    """Apply subset > dataset > [general] > flat args > default and validate every dataset."""
    if not isinstance(datasets, list) or not datasets:
        raise Origin(file).error("datasets must be a non-empty array of tables: [[datasets]]")
    upper = {**defaults, **_level(general, Origin(file, path="general"), _UPPER_KEYS)}
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
        own = {k: v for k, v in fields.items() if k in DATASET_KEYS}
        own["subsets"] = (subsets, origin)
        resolved.append(_validate(DatasetConfig, own, origin))
    return resolved


def _without(table: object, key: str) -> object:
    return {k: v for k, v in table.items() if k != key} if isinstance(table, dict) else table
