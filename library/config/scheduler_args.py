"""kohya's lr_scheduler_args: what each schedule takes, read and checked before training.

sd-scripts splits every ``"key=value"`` item at its "=", reads the value as a Python literal and
passes the result to the schedule function as a keyword argument, next to the arguments it sets
itself from its own keys (warmup, cycles, power, ...). So the arguments a schedule accepts are
its function's remaining parameters; giving one that sd-scripts already sets fails there.
"""

from __future__ import annotations

import ast
import math
from collections.abc import Callable

from library.config.suggest import show_value
from library.errors import ConfigError

SHAPES = ("linear", "cosine", "1-sqrt")  # warmup_stable_decay's warmup_type / decay_type


def _number(value: object, lowest: float, strict: bool) -> str | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return "a number"
    if value < lowest or (strict and value == lowest):
        return f"a number {'>' if strict else '>='} {lowest:g}"
    return None


def _shape(value: object) -> str | None:
    return None if value in SHAPES else " or ".join(f'"{s}"' for s in SHAPES)


def parse_step_rules(text: str) -> tuple[list[tuple[int, float]], float]:
    """diffusers' piecewise_constant rules "1:100,0.5:200,0.1": (multiplier until step) pairs,
    then the multiplier after the last step. ValueError when the text is not of that form."""
    *pairs, last = [part.strip() for part in text.split(",")]
    rules = []
    for pair in pairs:
        value, sep, steps = pair.partition(":")
        if not sep:
            raise ValueError(pair)
        rules.append((int(steps), float(value)))
    return rules, float(last)


def _step_rules(value: object) -> str | None:
    expected = 'a text like "1:100,0.5:200,0.1" (multiplier:until step, ..., last multiplier)'
    if not isinstance(value, str):
        return expected
    try:
        rules, last = parse_step_rules(value)
    except ValueError:
        return expected
    numbers = [last, *(v for _, v in rules)]
    if any(not math.isfinite(v) or v < 0 for v in numbers) or any(s < 1 for s, _ in rules):
        return "multipliers >= 0 and steps >= 1"
    return None


Check = Callable[[object], "str | None"]

# schedule -> argument -> a check returning what the value must be (None: fine).
SCHEDULE_ARGS: dict[str, dict[str, Check]] = {
    "cosine": {"num_cycles": lambda v: _number(v, 0, strict=True)},
    "polynomial": {"lr_end": lambda v: _number(v, 0, strict=False)},
    "cosine_with_min_lr": {"min_lr": lambda v: _number(v, 0, strict=False)},
    "warmup_stable_decay": {"warmup_type": _shape, "decay_type": _shape},
    "piecewise_constant": {"step_rules": _step_rules},
}


def _literal(text: str) -> object:
    """A Python literal as sd-scripts reads it; text that is none stays text (so
    ``step_rules=1:10,0.1`` needs no quotes here)."""
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        return text


def scheduler_args(args: list[str] | dict) -> dict[str, object]:
    """``lr_scheduler_args`` as a dict; ConfigError for an item that is not "key=value"."""
    if isinstance(args, dict):
        return dict(args)
    values: dict[str, object] = {}
    for item in args:
        key, sep, text = item.partition("=")
        key, text = key.strip(), text.strip()
        if not sep or not key or not text:
            raise ConfigError(f'lr_scheduler_args item {show_value(item)} is not "key=value"')
        if key in values:
            raise ConfigError(f'lr_scheduler_args sets "{key}" twice')
        values[key] = _literal(text)
    return values


def scheduler_args_problem(schedule: str, args: dict[str, object]) -> str | None:
    """Why ``args`` do not fit ``schedule`` (None: they do)."""
    accepted = SCHEDULE_ARGS.get(schedule, {})
    for key, value in args.items():
        if key not in accepted:
            takes = ", ".join(accepted) if accepted else "none"
            return (
                f'lr_scheduler_args "{key}" is not an argument of lr_scheduler = "{schedule}" '
                f"(it takes: {takes}); remove it"
            )
        expected = accepted[key](value)
        if expected:
            return f"lr_scheduler_args {key} = {show_value(value)}: give {expected}"
    return None


# schedule keys that only some schedules read (sd-scripts ignores them with the others)
USED_BY = {
    "lr_scheduler_min_lr_ratio": ("cosine_with_min_lr", "warmup_stable_decay"),
    "lr_decay_steps": ("warmup_stable_decay",),
    "lr_scheduler_timescale": ("inverse_sqrt",),
}


def unused_notes(given: dict[str, tuple[object, str]], schedule: str) -> list[str]:
    """Notes for the USED_BY keys in ``given`` (key -> (value, the file that set it)) that
    ``schedule`` does not read; their default values (unset, 0) need no note."""
    notes = []
    for key, (value, file) in given.items():
        users = USED_BY.get(key, (schedule,))
        if schedule in users or value in (None, 0):
            continue
        names = " and ".join(f'"{name}"' for name in users)
        notes.append(
            f"{file}: {key} = {show_value(value)} is not used: only lr_scheduler {names} "
            f'read it, and lr_scheduler is "{schedule}"'
        )
    return notes
