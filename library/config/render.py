"""Write a resolved Config as difftune's sectioned TOML, loadable again by load_config."""

from __future__ import annotations

import tomli_w
from pydantic import BaseModel

from library.config.dataset_schema import DatasetConfig
from library.config.schema import SECRET_KEYS, SECTIONS, Config

_HEADER = (
    "# difftune config, fully resolved (unset keys, and dataset keys at their defaults, are "
    "omitted).\n# Load it with --config.\n"
)


def _value(value: object) -> str:
    """One TOML value on one line (tomli_w writes lists over several lines)."""
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{_key(k)} = {_value(v)}" for k, v in value.items()) + " }"
    return tomli_w.dumps({"v": value})[len("v = ") :].rstrip("\n")


def _key(key: str) -> str:
    return tomli_w.dumps({key: 0}).split(" = ")[0]


def _table(header: str, values: dict) -> list[str]:
    lines = [header]
    lines += [f"{_key(k)} = {_value(v)}" for k, v in values.items() if v is not None]
    return lines + [""]


# Dataset and subset keys always written; the many augmentation and caption keys only when
# they differ from their defaults, so a plain dataset stays short.
_ALWAYS = {"batch_size", "resolution", "image_dir", "caption_extension", "num_repeats", "is_reg"}


def _shown(model: BaseModel, exclude: set[str] = frozenset()) -> dict:
    full = model.model_dump(exclude=exclude)
    changed = model.model_dump(exclude=exclude, exclude_defaults=True)
    return {k: v for k, v in full.items() if k in _ALWAYS or k in changed}


def _datasets(datasets: list[DatasetConfig]) -> list[str]:
    lines: list[str] = []
    for dataset in datasets:
        lines += _table("[[datasets]]", _shown(dataset, {"subsets"}))
        for subset in dataset.subsets:
            lines += _table("[[datasets.subsets]]", _shown(subset))
    return lines


def render_toml(config: Config) -> str:
    """The config as TOML: one table per section, then [[datasets]] / [[datasets.subsets]].

    None values are omitted (TOML has no null; unset is the default). Dataset keys given as
    plain keys go in a [dataset_defaults] table (any table name is read as plain keys). When the datasets came
    from train_data_dir or dataset_config, that key is written and the resolved datasets follow
    as comments: loading the output reads the same source again (writing both would conflict).
    """
    lines = [_HEADER]
    for name in SECTIONS:
        section = getattr(config, name)
        values = section.model_dump(exclude=SECRET_KEYS)
        if all(value is None for value in values.values()):
            continue  # a section with nothing set (e.g. [flow] for SD) would be an empty table
        lines += _table(f"[{name}]", values)
        secrets = [k for k in SECRET_KEYS if getattr(section, k, None) is not None]
        if secrets:  # say it is set without showing it
            lines[-1:-1] = [f"# {key} is set (not shown)" for key in sorted(secrets)]
    if config.dataset_defaults:
        lines += _table("[dataset_defaults]", config.dataset_defaults)
    datasets = _datasets(config.datasets)
    data = config.data
    if data.train_data_dir is not None or data.dataset_config is not None:
        source = "train_data_dir" if data.train_data_dir is not None else "dataset_config"
        lines.append(f"# The datasets as resolved from {source} (for reading; not loaded):")
        lines += [f"# {line}" if line else "#" for line in datasets[:-1]]
    else:
        lines += datasets[:-1]
    return "\n".join(lines) + "\n"
