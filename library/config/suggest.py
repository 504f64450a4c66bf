"""Turn config mistakes into one-line messages: nearest valid key, readable types, pydantic errors."""

from __future__ import annotations

import difflib
import json
import types
import typing
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, ValidationError

from library.errors import ConfigError

DOCS_HINT = "see docs/config.md for the valid keys"

# pydantic error types that come from a Field constraint; they get a "number >= 0" style message.
_CONSTRAINTS = {
    "greater_than": ">",
    "greater_than_equal": ">=",
    "less_than": "<",
    "less_than_equal": "<=",
}


def nearest(name: str, candidates: Iterable[str], cutoff: float = 0.6) -> str | None:
    """The candidate closest to ``name`` by difflib ratio, or None when nothing is close."""
    matches = difflib.get_close_matches(name, sorted(set(candidates)), n=1, cutoff=cutoff)
    return matches[0] if matches else None


# How close a name must be to a real key to be taken for a typo of it (a letter or two off:
# "learnig_rate"), not for another tool's key that merely looks alike.
NEAR_MISS = 0.85


def near_miss(name: str, candidates: Iterable[str]) -> str | None:
    """The real key ``name`` is most likely a typo of, or None."""
    return nearest(name, candidates, NEAR_MISS)


def did_you_mean(name: str, candidates: Iterable[str], prefix: str = "") -> str:
    """'did you mean "x"?' for the nearest candidate, else a pointer to the docs."""
    match = nearest(name, candidates)
    if match is None:
        return f"no similar key exists; {DOCS_HINT}"
    return f'did you mean "{prefix}{match}"?'


def show_value(value: object) -> str:
    """A value as the user would write it in TOML (strings quoted, true/false lower case)."""
    return json.dumps(value, default=str)


def describe_type(annotation: object) -> str:
    """A field annotation in words: ``float | None`` -> "a number"."""
    origin = typing.get_origin(annotation)
    if origin is Literal:
        choices = ", ".join(show_value(v) for v in typing.get_args(annotation))
        return f"one of {choices}" if len(typing.get_args(annotation)) > 1 else choices
    if origin in (typing.Union, types.UnionType):
        members = [a for a in typing.get_args(annotation) if a is not type(None)]
        if int in members and float in members:
            members.remove(int)
        words = list(dict.fromkeys(describe_type(a) for a in members))
        return words[0] if len(words) == 1 else ", ".join(words[:-1]) + " or " + words[-1]
    if origin is list:
        (item,) = typing.get_args(annotation) or (object,)
        if typing.get_origin(item) is typing.Annotated:  # constrained items: list[Annotated[int, ...]]
            item = typing.get_args(item)[0]
        return "a list" + _PLURALS.get(item, "")
    if origin is dict or annotation is dict:
        return "a table"
    return _SINGULARS.get(annotation, str(annotation))


_SINGULARS = {bool: "true or false", int: "a whole number", float: "a number", str: "a string"}
_PLURALS = {str: " of strings", int: " of whole numbers", float: " of numbers"}


def field_problem(model: type[BaseModel], key: str, errors: list[dict]) -> str:
    """What is wrong with one field, given pydantic's errors for it (all with loc[0] == key)."""
    annotation = model.model_fields[key].annotation
    for err in errors:
        if err["type"] == "missing":
            return "missing"
    for err in errors:
        op = _CONSTRAINTS.get(err["type"])
        if op is not None:
            bound = next(iter(err.get("ctx", {}).values()), "?")
            return f"expected {describe_type(annotation)} {op} {bound}"
        if err["type"] == "too_short":
            return "expected at least one entry"
        if err["type"] == "finite_number":
            return f"expected a finite number ({describe_type(annotation)}, not inf or nan)"
    for err in errors:
        if err["type"] == "value_error":
            return str(err["ctx"]["error"])
    return f"expected {describe_type(annotation)}"


def validation_problems(
    model: type[BaseModel],
    exc: ValidationError,
    locate: Callable[[str | None], tuple[str, str]],
    values: dict[str, object],
) -> list[tuple[str, str | None, str]]:
    """Every problem of a ValidationError, one per field (model-level checks last), as
    (file, shown key or None, text without the "config error in <file>: " prefix).

    ``locate(key)`` returns (file, shown key name) for a field, e.g. ("d.toml",
    "datasets[0].subsets[1].num_repeats"); ``locate(None)`` the file of a model-level check and
    the table it concerns (or "").
    """
    by_key: dict[str | None, list[dict]] = {}
    for err in exc.errors():
        key = err["loc"][0] if err["loc"] else None
        if not isinstance(key, str) or key not in model.model_fields:
            key = None
        by_key.setdefault(key, []).append(err)
    problems = []
    for key, errors in by_key.items():
        if key is None:
            continue
        file, shown = locate(key)
        problem = field_problem(model, key, errors)
        if problem == "missing":
            problems.append((file, shown, f'key "{shown}" is required'))
        else:
            value = show_value(values.get(key))
            problems.append((file, shown, f'key "{shown}" = {value} is not valid: {problem}'))
    for err in by_key.get(None, []):
        file, where = locate(None)
        msg = err["msg"].removeprefix("Value error, ")
        problems.append((file, None, f"{where + ': ' if where else ''}{msg}"))
    return problems


def validation_lines(
    model: type[BaseModel],
    exc: ValidationError,
    locate: Callable[[str | None], tuple[str, str]],
    values: dict[str, object],
) -> str:
    """The first problem of a ValidationError as one line (see validation_problems)."""
    file, _, text = validation_problems(model, exc, locate, values)[0]
    return f"config error in {file}: {text}"


COMMAND_LINE = "command line"


@dataclass(frozen=True)
class Origin:
    """Where a config value was written, for error messages."""

    file: str  # the path as the user wrote it, or COMMAND_LINE
    table: str | None = None  # flat args: the TOML table the key sat in (None: top level)
    path: str | None = None  # dataset keys: "general", "datasets[0]", "datasets[0].subsets[1]"
    # True where the schema default stands in for a value nobody wrote: errors still name
    # ``file``, and the value's provenance is "default".
    default: bool = False

    def shown(self, key: str) -> str:
        """The key as the user should look for it: ``datasets[0].subsets[1].num_repeats``."""
        return f"{self.path}.{key}" if self.path else key

    def where(self) -> str:
        """' in [training]', ' in datasets[0]', ' at the top level' or '' (command line)."""
        if self.path:
            return " in [general]" if self.path == "general" else f" in {self.path}"
        if self.table:
            return f" in [{self.table}]"
        return "" if self.file == COMMAND_LINE else " at the top level"

    def error(self, text: str, key: str | None = None) -> ConfigError:
        """A ConfigError whose message starts with 'config error in <file>: ' (``key``: the
        key it concerns, as shown to the user)."""
        file = None if self.file == COMMAND_LINE else self.file
        return ConfigError(f"config error in {self.file}: {text}", file=file, key=key)
