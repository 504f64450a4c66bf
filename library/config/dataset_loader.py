"""The training data of a config: kohya's [general] / [[datasets]] / [[datasets.subsets]]
tables, dataset_config files and train_data_dir folders, resolved with kohya's precedence
(subset > dataset > [general] > flat arguments > default) and validated. The command line wins
over all of them: ``--resolution`` or ``--train_batch_size`` replaces what every table says,
with a warning naming each table value it replaces (sd-scripts' tables would win silently).

Where sd-scripts warns about a setting and goes on, so does difftune, with the same warning: a
subset with ``num_repeats = 0`` (or a ``0_name`` folder) is left out, a subfolder of
train_data_dir without a repeat count is left out, and bucket limits that are not multiples of
``bucket_reso_steps`` are rounded outwards to the nearest multiples.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from pydantic import BaseModel

from library.config import kohya
from library.config.dataset_schema import MAX_IMAGE_SIDE, DatasetConfig, SubsetConfig
from library.config.kohya_values import UNSET, normalise
from library.config.musubi_dataset import SOURCE_KEYS, bucketing_defaults
from library.config.overrides import DATASET_KEYS, SUBSET_KEYS, all_key_names, key_kind
from library.config.problems import Entry, Problems, source_of, validate
from library.config.suggest import COMMAND_LINE, Origin, did_you_mean, near_miss, show_value
from library.config.toml_files import read_toml
from library.data.folders import dreambooth_subsets

# Dataset-level keys and the subset keys that may also be written above the subsets.
UPPER_KEYS = DATASET_KEYS + tuple(k for k in SUBSET_KEYS if k not in ("image_dir", "metadata_file"))


@dataclass
class DataGiven:
    """The training data after layering: what the last layer that gave data said, plus the
    [general] keys of the layers after it."""

    general: dict[str, Entry]
    inline: list | None
    inline_file: str | None


@dataclass
class DatasetInputs:
    """What resolving the datasets reads besides the tables: the flat keys and the validated
    sections (for batch size, resolution and folders), and where to report."""

    flat: dict[str, Entry]
    sections: dict[str, BaseModel]
    files: str  # the config files, for a message that concerns all of them
    defaults: dict[str, Entry]  # dataset and subset keys written flat (kohya's plain arguments)
    sources: dict[str, str]  # receives where each dataset key came from
    problems: Problems
    notices: list[str]  # receives sd-scripts' warnings about settings it ignores
    # dataset and subset keys given on the command line, which win over every table
    command_line: dict[str, Entry] = field(default_factory=dict)


def check_dataset_keys(datasets: object, file: str, problems: Problems) -> None:
    """Check the keys of every [[datasets]] and [[datasets.subsets]] table of a file, also of
    those a later layer replaces; the datasets used are checked in full when resolved."""
    if not isinstance(datasets, list):
        return
    for i, raw in enumerate(datasets):
        if not isinstance(raw, dict):
            continue
        own, subsets, alone = dataset_tables(raw)
        table_keys(own, Origin(file, path=f"datasets[{i}]"), UPPER_KEYS, problems)
        for j, sub in enumerate(subsets if isinstance(subsets, list) else []):
            if isinstance(sub, dict):
                origin = Origin(file, path=_subset_path(f"datasets[{i}]", j, alone))
                table_keys(sub, origin, SUBSET_KEYS, problems)


def dataset_tables(raw: dict) -> tuple[dict, object, bool]:
    """A [[datasets]] table's own keys, its subset tables, and whether it is its own one subset:
    musubi-tuner's datasets have no subsets and name their images or videos in the dataset
    table (image_directory, image_jsonl_file, video_directory, video_jsonl_file), so their
    subset keys make the one subset."""
    names = {key: kohya.ALIASES.get(key, key) for key in raw}
    if "subsets" in raw or not any(names[key] in SOURCE_KEYS for key in raw):
        return _without(raw, "subsets"), raw.get("subsets"), False
    subset = {key: value for key, value in raw.items() if names[key] in SUBSET_KEYS}
    own = {key: value for key, value in raw.items() if key not in subset}
    return own, [subset], True


def _subset_path(dataset_path: str, index: int, alone: bool) -> str:
    # a dataset that is its own subset is named as the user wrote it
    return dataset_path if alone else f"{dataset_path}.subsets[{index}]"


def build_datasets(given: DataGiven, inputs: DatasetInputs) -> list[DatasetConfig]:
    """Resolve the datasets from the one source left after layering: train_data_dir,
    dataset_config or [[datasets]]. Problems of their keys go to ``inputs.problems``."""
    flat, sections, files = inputs.flat, inputs.sections, inputs.files
    data = sections["data"]
    general, inline = given.general, given.inline
    if data.reg_data_dir is not None and data.train_data_dir is None:
        raise flat["reg_data_dir"][1].error(
            "reg_data_dir needs train_data_dir; in a dataset config add the folder as a subset "
            "with is_reg = true",
            "reg_data_dir",
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
        **inputs.defaults,
        "batch_size": _entry(flat, "train_batch_size", sections["training"], files),
        "resolution": _entry(flat, "resolution", data, files),
        "caption_extension": _entry(flat, "caption_extension", data, files),
    }
    inputs.command_line = {k: e for k, e in defaults.items() if e[1].file == COMMAND_LINE}
    if data.dataset_config is not None:
        path = data.dataset_config
        raw_general, inline = _read_dataset_file(path)
        origin = Origin(path, path="general")
        general = table_keys(raw_general, origin, UPPER_KEYS, inputs.problems)
        return _resolve(inline, {**defaults, **general}, path, inputs)
    if data.train_data_dir is None:
        return _resolve(inline, {**defaults, **general}, given.inline_file, inputs)
    where = flat["train_data_dir"][1]
    if data.in_json is not None:
        subset = {
            "image_dir": data.train_data_dir,
            "metadata_file": data.in_json,
            "num_repeats": data.dataset_repeats,
        }
        inline = [{"subsets": [subset]}]
    else:
        inline = [{"subsets": _folder_subsets(data.train_data_dir, data.reg_data_dir, inputs)}]
    return _resolve(inline, {**defaults, **general}, where.file, inputs)


def _entry(flat: dict[str, Entry], key: str, section: BaseModel, files: str) -> Entry:
    # The validated value (schema default when unset) and where the user wrote it.
    origin = flat[key][1] if key in flat else Origin(files, default=True)
    return getattr(section, key), origin


def _read_dataset_file(path: str) -> tuple[dict, list]:
    doc = read_toml(path, "dataset_config file")
    for key in doc:
        if key not in ("general", "datasets"):
            raise Origin(path).error(not_dataset_key(key, Origin(path)), key)
    general = doc.get("general", {})
    if not isinstance(general, dict):
        raise Origin(path).error("general must be a table: [general]", "general")
    if not doc.get("datasets"):
        raise Origin(path).error("no [[datasets]] in the dataset config", "datasets")
    return general, doc["datasets"]


def _folder_subsets(train_dir: str, reg_dir: str | None, inputs: DatasetInputs) -> list[dict]:
    skipped: list[str] = []
    # A folder named "10" has no class tokens (None): leave the key unset so [general] applies.
    subsets = [
        {k: v for k, v in subset.items() if v is not None}
        for subset in dreambooth_subsets(train_dir, reg_dir, skipped)
    ]
    file = inputs.flat["train_data_dir"][1].file
    inputs.notices.extend(f"{file}: {note}" for note in skipped)
    return subsets


def not_dataset_key(key: str, origin: Origin) -> str:
    """Why ``key`` cannot stand in the dataset table ``origin`` names."""
    name = kohya.ALIASES.get(key, key)
    if name in DATASET_KEYS:
        return f'"{name}" is a dataset key; set it in [[datasets]] or [general], not a subset'
    if name in SUBSET_KEYS:
        return f'"{name}" belongs in [[datasets.subsets]]'
    if key_kind(name) == "flat":
        return f'"{name}" is a training argument, not a dataset key; set it in the main config'
    return f'unknown key "{key}"{origin.where()}; {did_you_mean(key, all_key_names())}'


def _is_unknown(key: str) -> bool:
    name = kohya.ALIASES.get(key, key)
    return key_kind(name) == "unknown" and name not in DATASET_KEYS and name not in SUBSET_KEYS


def table_keys(
    raw: object,
    origin: Origin,
    allowed: tuple[str, ...],
    problems: Problems,
    unset: set[str] | None = None,
) -> dict[str, Entry]:
    """The usable keys of one [general] / [[datasets]] / [[datasets.subsets]] table; every
    problem goes to ``problems``. Keys written with kohya's empty value go into ``unset``."""
    if not isinstance(raw, dict):
        raise origin.error(f"{origin.path} must be a table")
    out: dict[str, Entry] = {}
    for key, value in raw.items():
        name = kohya.ALIASES.get(key, key)
        value = normalise(name, value, _dataset_annotation(name))
        shown = origin.shown(name)
        if value is UNSET:
            if unset is not None:
                unset.add(name)
            continue
        if name in kohya.UNSUPPORTED:
            problem = kohya.unsupported_problem(name, value, shown)
            if problem:
                problems.add(origin, problem, shown)
        elif name not in allowed:
            text = not_dataset_key(key, origin)
            if _is_unknown(key):
                near = near_miss(key, all_key_names())
                problems.add_unknown(origin, text, origin.shown(key), near)
            else:
                problems.add(origin, text, shown)
        elif name in out:
            problems.add(origin, f'"{name}" is set twice{origin.where()}', shown)
        else:
            out[name] = (value, origin)
    return out


def _dataset_annotation(name: str) -> object | None:
    for model in (DatasetConfig, SubsetConfig):
        if name in model.model_fields:
            return model.model_fields[name].annotation
    return None


def _resolve(
    datasets: object, upper: dict[str, Entry], file: str, inputs: DatasetInputs
) -> list[DatasetConfig]:
    """Apply subset > dataset > ``upper`` ([general], flat args, defaults) and validate every
    dataset. ``file`` is where the [[datasets]] tables were written."""
    if not isinstance(datasets, list) or not datasets:
        raise Origin(file).error("datasets must be a non-empty array of tables: [[datasets]]")
    resolved = []
    for i, raw in enumerate(datasets):
        origin = Origin(file, path=f"datasets[{i}]")
        if not isinstance(raw, dict):
            raise origin.error(f"{origin.path} must be a table")
        own_raw, subsets_raw, alone = dataset_tables(raw)
        if alone and _folder_and_jsonl(raw, origin, inputs.problems):
            continue
        own_keys = table_keys(own_raw, origin, UPPER_KEYS, inputs.problems)
        fields = {**upper, **own_keys}
        _command_line_wins(fields, UPPER_KEYS, inputs)
        bucketing_defaults(fields, origin, alone, inputs.notices)
        if alone and not subsets_raw:
            continue  # a musubi-tuner video dataset, refused by its key's problem
        if not isinstance(subsets_raw, list) or not subsets_raw:
            raise origin.error(
                f"{origin.path} has no subsets: add [[datasets.subsets]] tables (or name its "
                "images in it with image_directory, as musubi-tuner's dataset configs do)"
            )
        subsets = _subsets(subsets_raw, fields, origin, inputs, alone)
        own = {k: v for k, v in fields.items() if k in DATASET_KEYS}
        _round_bucket_limits(own, origin, inputs.notices)
        _record(inputs.sources, origin.path, own)
        if subsets is None:  # a subset has a problem, reported with the others
            continue
        if not subsets:
            raise origin.error(
                f"{origin.path} has no subset left to train (each has num_repeats = 0); give "
                "one num_repeats >= 1"
            )
        own["subsets"] = (subsets, origin)
        dataset = validate(DatasetConfig, own, origin, inputs.problems)
        if dataset is not None:
            resolved.append(dataset)
    return resolved


def _folder_and_jsonl(raw: dict, origin: Origin, problems: Problems) -> bool:
    """Whether a musubi-tuner dataset table names its images twice, with a folder and with
    image_jsonl_file (the problem goes to ``problems``). musubi-tuner would read the folder and
    pass over the JSONL; neither half alone is what such a file asks for."""
    folder = next((key for key in ("image_directory", "image_dir") if key in raw), None)
    if folder is None or "image_jsonl_file" not in raw:
        return False
    problems.add(
        origin,
        f"{origin.path} names its images twice, with {folder} and with image_jsonl_file; "
        "keep one of them (a musubi-tuner dataset reads either a folder or a JSONL file)",
        origin.shown("image_jsonl_file"),
    )
    return True


def _subsets(
    subsets_raw: list,
    fields: dict[str, Entry],
    origin: Origin,
    inputs: DatasetInputs,
    alone: bool = False,
) -> list[SubsetConfig] | None:
    """The subsets that train (None when one of them has a problem, added to problems);
    ``alone``: the dataset table is its own one subset (dataset_tables)."""
    subsets: list[SubsetConfig] | None = []
    for j, sub in enumerate(subsets_raw):
        sub_origin = Origin(origin.file, path=_subset_path(origin.path, j, alone))
        merged = {k: v for k, v in fields.items() if k in SUBSET_KEYS}
        merged.update(table_keys(sub, sub_origin, SUBSET_KEYS, inputs.problems))
        _command_line_wins(merged, SUBSET_KEYS, inputs)
        repeats = merged.get("num_repeats", (1, None))[0]
        if repeats == 0 and not isinstance(repeats, bool):
            # sd-scripts leaves such a subset out with a warning; files use it to switch one off
            folder = merged.get("image_dir", merged.get("metadata_file", (None, None)))[0]
            inputs.notices.append(
                f"{origin.file}: {sub_origin.path} ({folder}) is left out: num_repeats = 0, "
                "as sd-scripts does"
            )
            continue
        subset = validate(SubsetConfig, merged, sub_origin, inputs.problems)
        _record(inputs.sources, sub_origin.path, merged)
        if subset is None:
            subsets = None
        elif subsets is not None:
            subsets.append(subset)
    return subsets


# The command-line option of a dataset key where the two names differ.
_OPTION_OF = {"batch_size": "train_batch_size"}


def _command_line_wins(fields: dict[str, Entry], keys: tuple[str, ...], inputs: DatasetInputs):
    """Put the command line's values of ``keys`` over ``fields`` (one table's resolved keys),
    with a warning for each value a table wrote otherwise."""
    for key, entry in inputs.command_line.items():
        if key not in keys:
            continue
        written = fields.get(key)
        if written is not None and written[1].file != COMMAND_LINE and not written[1].default:
            value, origin = written
            if _shown(key, value) != _shown(key, entry[0]):
                note = (
                    f"{origin.file}: {key} = {_shown(key, value)}{origin.where()} is replaced by "
                    f"--{_OPTION_OF.get(key, key)} {_shown(key, entry[0])} (the command line wins "
                    "over the files)"
                )
                if note not in inputs.notices:
                    inputs.notices.append(note)
        fields[key] = entry


def _shown(key: str, value: object) -> str:
    """A value for a message, a resolution as "W,H" however it was written."""
    if key == "resolution" and isinstance(value, int) and not isinstance(value, bool):
        value = (value, value)
    if key == "resolution" and isinstance(value, (list, tuple)):
        return ",".join(str(v) for v in value)
    if key == "resolution" and isinstance(value, str):
        return value.replace(" ", "")
    return show_value(value)


def _round_bucket_limits(own: dict[str, Entry], origin: Origin, notices: list[str]) -> None:
    """sd-scripts rounds min_bucket_reso down and max_bucket_reso up to multiples of
    bucket_reso_steps, with a warning; do the same (only where buckets are on)."""
    fields = DatasetConfig.model_fields

    def value_of(key: str) -> object:
        return own[key][0] if key in own else fields[key].default

    steps = value_of("bucket_reso_steps")
    if value_of("enable_bucket") is not True or not _is_count(steps):
        return
    if value_of("bucketing") == "musubi":
        return  # no bucket range (library.data.buckets)
    for key, down in (("min_bucket_reso", True), ("max_bucket_reso", False)):
        value = value_of(key)
        if not _is_count(value) or value % steps == 0:
            continue
        written = own[key][1] if key in own else Origin(origin.file, path=origin.path, default=True)
        rounded = value - value % steps if down else value + steps - value % steps
        if not MIN_BUCKET_SIDE <= rounded <= MAX_IMAGE_SIDE:
            continue  # out of range either way: the check names the value as written
        own[key] = (rounded, written)
        default = " (the default)" if written.default else ""
        notices.append(
            f"{written.file}: {written.shown(key)} = {value}{default} is rounded to {rounded}, "
            f"a multiple of bucket_reso_steps = {steps}, as sd-scripts does"
        )


MIN_BUCKET_SIDE = DatasetConfig.model_fields["min_bucket_reso"].metadata[0].ge


def _is_count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def _without(table: object, key: str) -> object:
    return {k: v for k, v in table.items() if k != key} if isinstance(table, dict) else table


def _record(sources: dict[str, str], prefix: str, entries: dict[str, Entry]) -> None:
    for key, (_, origin) in entries.items():
        sources[f"{prefix}.{key}"] = source_of(origin)
