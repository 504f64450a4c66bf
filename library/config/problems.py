"""Every problem of a config, collected while it loads and refused in one error.

A file with seven unknown keys is refused once, naming all seven (each with its "did you mean"),
not seven times in seven attempts. Keys that no tool defines are kept apart from the other
problems: ``--ignore_unknown_keys`` loads a file that carries a front end's leftovers without
them (listed in one warning), while typos stay errors by default and every other problem still
stops the run.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from pydantic import BaseModel, ValidationError

from library.config.provenance import DEFAULT
from library.config.suggest import COMMAND_LINE, Origin, validation_problems
from library.errors import ConfigError, Problem

# The command-line switch that loads a file without its unknown keys.
IGNORE_UNKNOWN = "--ignore_unknown_keys"

# A value and where it was written.
Entry = tuple[object, Origin]


@dataclass(frozen=True)
class _Found:
    file: str  # as the user wrote it, or COMMAND_LINE
    key: str | None  # as shown to the user ("datasets[0].subsets[1].num_repeats")
    text: str  # what is wrong and the fix, without "config error in <file>: "
    unknown: bool = False  # a key that no tool defines
    near: str | None = None  # an unknown key's nearest real key (a likely typo of it)

    def problem(self) -> Problem:
        file = None if self.file == COMMAND_LINE else self.file
        return Problem(f"config error in {self.file}: {self.text}", file, self.key)


@dataclass
class Problems:
    """The problems found so far; ``raise_if_any`` refuses them all in one ConfigError."""

    found: list[_Found] = field(default_factory=list)
    ignore_unknown: bool = False  # --ignore_unknown_keys: unknown keys are dropped, not refused
    ignored: list[_Found] = field(default_factory=list)  # the unknown keys dropped

    def add(self, origin: Origin, text: str, key: str | None = None) -> None:
        self.found.append(_Found(origin.file, key, text))

    def add_unknown(self, origin: Origin, text: str, key: str, near: str | None = None) -> None:
        """A key that no tool defines (a typo, or a front end's leftover): a problem, or with
        ``ignore_unknown`` a key to drop and name in a warning (``near``: the real key it is
        close to, which that warning suggests)."""
        found = _Found(origin.file, key, text, unknown=True, near=near)
        (self.ignored if self.ignore_unknown else self.found).append(found)

    def add_error(self, error: ConfigError) -> None:
        """A problem a helper raised as a ConfigError (its message kept whole)."""
        for problem in error.problems:
            file = problem.file or COMMAND_LINE
            text = problem.message.removeprefix(f"config error in {file}: ")
            self.found.append(_Found(file, problem.key, text))

    def add_validation(
        self, model: type[BaseModel], exc: ValidationError, values: dict[str, Entry], fallback: Origin
    ) -> None:
        """Every field problem of a pydantic ValidationError of ``model`` built from ``values``."""

        def locate(key: str | None) -> tuple[str, str]:
            if key is None:
                written = {o.file for _, o in values.values() if not o.default}
                return " and ".join(sorted(written or {fallback.file})), fallback.path or ""
            origin = values[key][1] if key in values else fallback
            return origin.file, origin.shown(key)

        plain = {k: v for k, (v, _) in values.items()}
        sources = {k: source_of(o) for k, (_, o) in values.items()}
        for file, key, text in validation_problems(model, exc, locate, plain):
            if key is None:  # a rule across keys: name the layers that set them, and where each was
                file = involved(text, sources, file)
                text += sources_note(text, sources, file)
            self.found.append(_Found(file, key, text))

    def ignored_notices(self) -> list[str]:
        """The warnings for the unknown keys dropped (``ignore_unknown``): one line per file
        naming the foreign keys, and one per key that is a near miss of a real key (a typo
        whose value would otherwise vanish unnoticed), with the key it is close to."""
        by_file: dict[str, list[str]] = {}
        near_misses = []
        for found in self.ignored:
            if found.near is None:
                by_file.setdefault(found.file, []).append(found.key)
            else:
                near_misses.append(
                    f'{found.file}: ignored "{found.key}" ({IGNORE_UNKNOWN}), its value unused: '
                    f'no tool defines it, but did you mean "{found.near}"?'
                )
        foreign = [
            f"{file}: ignored {', '.join(dict.fromkeys(keys))} ({IGNORE_UNKNOWN}): no tool "
            "difftune knows defines these keys"
            for file, keys in by_file.items()
        ]
        return list(dict.fromkeys(near_misses)) + foreign  # a dataset key is checked twice

    def raise_if_any(self) -> None:
        """Refuse every problem found so far in one ConfigError (nothing when there is none)."""
        if not self.found:
            return
        self.found = list(dict.fromkeys(self.found))  # one key checked by two rules
        problems = tuple(f.problem() for f in self.found)
        unknown = sum(f.unknown for f in self.found)
        if len(self.found) == 1:
            only = self.found[0]
            hint = f" (or load the file without it: {IGNORE_UNKNOWN})" if unknown else ""
            raise ConfigError(f"config error in {only.file}: {only.text}{hint}", problems=problems)
        files = list(dict.fromkeys(f.file for f in self.found))
        lines = [f"{f.file}: {f.text}" if len(files) > 1 else f.text for f in self.found]
        header = f"config error in {' and '.join(files)}: {len(self.found)} problems"
        raise ConfigError(
            header + _switch_hint(unknown, len(self.found)) + ":\n  " + "\n  ".join(lines),
            problems=problems,
        )


def source_of(origin: Origin) -> str:
    """Where a value came from, for provenance: its file, the command line, or "default"."""
    return DEFAULT if origin.default else origin.file


def _named(message: str, sources: dict[str, str]) -> dict[str, str]:
    """The keys ``message`` names that a file or the command line set -> where."""
    return {
        key: source
        for key, source in sources.items()
        if source != DEFAULT and re.search(rf"(?<![\w.]){re.escape(key)}(?!\w)", message)
    }


def involved(message: str, sources: dict[str, str], fallback: str) -> str:
    """The layers a rule across keys concerns, for its "config error in ..." header: those that
    set the keys ``message`` names ("base.toml and command line"), in the order first named;
    ``fallback`` where it names none that was set."""
    layers = list(dict.fromkeys(_named(message, sources).values()))
    return " and ".join(layers) if layers else fallback


def sources_note(message: str, sources: dict[str, str], shown_file: str) -> str:
    """' (full_bf16 from base.toml, mixed_precision from the command line)': where the keys
    that ``message`` names got their values; "" when none was set, or all in ``shown_file``
    (the file the message already names)."""
    named = _named(message, sources)
    if not named or set(named.values()) == {shown_file}:
        return ""
    words = [
        f"{key} from {'the command line' if source == COMMAND_LINE else source}"
        for key, source in named.items()
    ]
    return f" ({', '.join(words)})"


def _switch_hint(unknown: int, total: int) -> str:
    if not unknown:
        return ""
    if unknown == total:
        return f" ({IGNORE_UNKNOWN} loads the file without these unknown keys)"
    keys = "unknown key" if unknown == 1 else f"{unknown} unknown keys"
    return f" ({IGNORE_UNKNOWN} loads the file without its {keys}; the rest need a fix)"


def validate(
    model: type[BaseModel], values: dict[str, Entry], fallback: Origin, problems: Problems
) -> BaseModel | None:
    """``model`` built from ``values``, or None with every problem added to ``problems``."""
    try:
        return model.model_validate({k: v for k, (v, _) in values.items()})
    except ValidationError as exc:
        problems.add_validation(model, exc, values, fallback)
        return None
