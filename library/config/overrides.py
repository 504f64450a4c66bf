"""The flat key namespace and command-line override values typed by their schema field."""

from __future__ import annotations

import tomllib
import types
import typing
from typing import Literal

from library.config.dataset_schema import DatasetConfig, SubsetConfig
from library.config.kohya import ALIASES, UNSUPPORTED
from library.config.schema import SECTIONS, field_sections
from library.config.suggest import COMMAND_LINE, Origin, did_you_mean

# Keys of the kohya dataset schema, by the level that owns them.
DATASET_KEYS = tuple(k for k in DatasetConfig.model_fields if k != "subsets")
SUBSET_KEYS = tuple(SubsetConfig.model_fields)

# A raw override: a string ("--key value" / "--key=value"), several strings ("--network_args a b")
# or None (a bare "--flag").
RawValue = str | list[str] | None

KeyKind = Literal["flat", "default", "unsupported", "dataset", "unknown"]

# Dataset and subset keys that kohya also takes as plain arguments: written flat (or on the
# command line) they are defaults for every dataset. The others name one folder or one dataset.
_PER_SUBSET_ONLY = (
    "image_dir",
    "metadata_file",
    "class_tokens",
    "is_reg",
    "num_repeats",
    "batch_size",
    "cache_directory",
    "control_directory",
)
DEFAULT_KEYS = tuple(
    k for k in DATASET_KEYS + SUBSET_KEYS if k not in _PER_SUBSET_ONLY and k not in field_sections()
)


def flat_keys() -> tuple[str, ...]:
    """Every key of the sectioned schema (the flat namespace)."""
    return tuple(field_sections())


def key_kind(key: str) -> KeyKind:
    """What a flat key is: a schema key, a known-unsupported kohya key, a dataset key or unknown.

    ``key`` must already be mapped through kohya.ALIASES.
    """
    if key in field_sections():
        return "flat"
    if key in DEFAULT_KEYS:
        return "default"
    if key in UNSUPPORTED:
        return "unsupported"
    if key in DATASET_KEYS or key in SUBSET_KEYS:
        return "dataset"
    return "unknown"


def all_key_names() -> tuple[str, ...]:
    """Every key a user may write anywhere (for "did you mean" suggestions)."""
    return flat_keys() + DATASET_KEYS + SUBSET_KEYS


def flat_key_problem(key: str, origin: Origin, extra: tuple[str, ...] = ()) -> str:
    """Why ``key`` cannot stand in the flat namespace (its kind is "dataset" or "unknown")."""
    if key_kind(key) == "dataset":
        level = "[[datasets]]" if key in DATASET_KEYS else "[[datasets.subsets]]"
        hint = " (the flat equivalent is train_batch_size)" if key == "batch_size" else ""
        cli = origin.file == COMMAND_LINE
        place = " of the config file, not on the command line" if cli else ""
        return f'"{key}" is a dataset key; set it in {level} or [general]{place}{hint}'
    if origin.file == COMMAND_LINE:
        names = flat_keys() + DEFAULT_KEYS + tuple(UNSUPPORTED) + extra
        return f'unknown option "--{key}"; {did_you_mean(key, names, prefix="--")}'
    return f'unknown key "{key}"{origin.where()}; {did_you_mean(key, all_key_names())}'


def annotation(key: str) -> object:
    """The type annotation of a flat schema key or a dataset default key."""
    if key in DEFAULT_KEYS:
        model = DatasetConfig if key in DatasetConfig.model_fields else SubsetConfig
        return model.model_fields[key].annotation
    return SECTIONS[field_sections()[key]].model_fields[key].annotation


def _typed(key: str) -> bool:
    return key in field_sections() or key in DEFAULT_KEYS


def _members(tp: object) -> tuple[object, ...]:
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        return tuple(a for a in typing.get_args(tp) if a is not type(None))
    return (tp,)


def is_bool_key(key: str) -> bool:
    """A key that is true/false, so a bare ``--key`` means true."""
    key = ALIASES.get(key, key)
    if key in UNSUPPORTED:
        return any(isinstance(off, bool) for off in UNSUPPORTED[key].off)
    return _typed(key) and _members(annotation(key)) == (bool,)


def is_list_key(key: str) -> bool:
    """A key holding kohya "k=v" strings: ``--key a=1 b=2`` takes several values."""
    key = ALIASES.get(key, key)
    return _typed(key) and list[str] in _members(annotation(key))


def takes_table(key: str) -> bool:
    """A schema key whose value may itself be a TOML table (``[optimizer_args]``); any other
    table, whatever its name, is a group of keys (kohya flattens every table)."""
    key = ALIASES.get(key, key)
    return key in field_sections() and any(
        m is dict or typing.get_origin(m) is dict for m in _members(annotation(key))
    )


def _is_str_key(key: str) -> bool:
    members = _members(annotation(key))
    return all(m is str or typing.get_origin(m) is Literal for m in members)


def _toml_value(raw: str) -> object:
    try:
        parsed = tomllib.loads(f"v = {raw}")
    except tomllib.TOMLDecodeError:
        return raw
    return parsed["v"] if list(parsed) == ["v"] else raw


def parse_override(key: str, raw: RawValue) -> object:
    """The typed value of ``--key raw``: str fields keep the string, others parse as TOML.

    A value that is not valid TOML stays a string, so ``--resolution 768,512`` works and
    ``--learning_rate fast`` reaches validation, which names the expected type. A bare flag
    (None) means true; the caller reports None for a non-bool key.
    """
    key = ALIASES.get(key, key)
    if raw is None:
        return True if is_bool_key(key) else None
    if isinstance(raw, list):
        return list(raw)
    if is_bool_key(key) and raw.lower() in ("true", "false"):
        return raw.lower() == "true"
    if _typed(key) and _is_str_key(key):
        return raw
    value = _toml_value(raw)
    if is_list_key(key) and isinstance(value, str):
        return [value]  # --optimizer_args=weight_decay=0.01
    return value
