"""Write a resolved Config as difftune's sectioned TOML, loadable again by load_config."""

from __future__ import annotations

import tomli_w
from pydantic import BaseModel

from library.config.dataset_schema import DatasetConfig
from library.config.provenance import Provenance, provenance
from library.config.schema import SECRET_KEYS, SECTIONS, Config
from library.config.suggest import COMMAND_LINE

_HEADER = (
    "# difftune config, fully resolved (unset keys, and dataset keys at their defaults, are "
    "omitted).\n# Load it with --config. Each key is marked with where its value came from: a "
    "config file,\n# the command line, or the default.\n"
)

_COMMENT_COLUMN = 40  # where the source comments start, unless the line is longer


def _value(value: object) -> str:
    """One TOML value on one line (tomli_w writes lists over several lines)."""
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{_key(k)} = {_value(v)}" for k, v in value.items()) + " }"
    return tomli_w.dumps({"v": value})[len("v = ") :].rstrip("\n")


def _key(key: str) -> str:
    return tomli_w.dumps({key: 0}).split(" = ")[0]


def _table(header: str, values: dict, origin: Provenance, prefix: str = "") -> list[str]:
    """A table's lines, each key followed by ``# <source>`` (its source is looked up as
    ``prefix + key``)."""
    lines = [header]
    for k, v in values.items():
        if v is not None:
            line = f"{_key(k)} = {_value(v)}"
            lines.append(f"{line:<{_COMMENT_COLUMN}}  # {origin.source(prefix + k)}")
    return lines + [""]


# Dataset and subset keys always written; the many augmentation and caption keys only when
# they differ from their defaults, so a plain dataset stays short.
_ALWAYS = {"batch_size", "resolution", "image_dir", "caption_extension", "num_repeats", "is_reg"}


def _shown(model: BaseModel, exclude: set[str] = frozenset()) -> dict:
    full = model.model_dump(exclude=exclude)
    changed = model.model_dump(exclude=exclude, exclude_defaults=True)
    return {k: v for k, v in full.items() if k in _ALWAYS or k in changed}


def _datasets(datasets: list[DatasetConfig], origin: Provenance) -> list[str]:
    lines: list[str] = []
    for i, dataset in enumerate(datasets):
        path = f"datasets[{i}]"
        lines += _table("[[datasets]]", _shown(dataset, {"subsets"}), origin, f"{path}.")
        for j, subset in enumerate(dataset.subsets):
            lines += _table("[[datasets.subsets]]", _shown(subset), origin, f"{path}.subsets[{j}].")
    return lines


def _layers(origin: Provenance) -> list[str]:
    if not origin.files and not origin.command_line:
        return []
    layers = list(origin.files)
    if origin.command_line:
        layers.append(f"{COMMAND_LINE} ({', '.join(origin.command_line)})")
    return [f"# Layers, later ones winning: {'; '.join(layers)}", ""]


def render_toml(config: Config) -> str:
    """The config as TOML: one table per section, then [[datasets]] / [[datasets.subsets]].

    None values are omitted (TOML has no null; unset is the default). Every key ends with a
    comment naming where its value came from (library/config/provenance.py). Dataset keys
    given as plain keys go in a [dataset_defaults] table (any table name is read as plain keys).
    When the datasets came from train_data_dir or dataset_config, that key is written and the
    resolved datasets follow as comments: loading the output reads the same source again
    (writing both would conflict).
    """
    origin = provenance(config)
    lines = [_HEADER, *_layers(origin)]
    for name in SECTIONS:
        section = getattr(config, name)
        values = section.model_dump(exclude=SECRET_KEYS)
        if all(value is None for value in values.values()):
            continue  # a section with nothing set (e.g. [flow] for SD) would be an empty table
        lines += _table(f"[{name}]", values, origin)
        secrets = [k for k in SECRET_KEYS if getattr(section, k, None) is not None]
        if secrets:  # say it is set without showing it
            lines[-1:-1] = [
                f"# {key} is set (not shown)  # {origin.source(key)}" for key in sorted(secrets)
            ]
    if config.dataset_defaults:
        lines += _table("[dataset_defaults]", config.dataset_defaults, origin)
    datasets = _datasets(config.datasets, origin)
    data = config.data
    if data.train_data_dir is not None or data.dataset_config is not None:
        source = "train_data_dir" if data.train_data_dir is not None else "dataset_config"
        lines.append(f"# The datasets as resolved from {source} (for reading; not loaded):")
        lines += [f"# {line}" if line else "#" for line in datasets[:-1]]
    else:
        lines += datasets[:-1]
    return "\n".join(lines) + "\n"
