"""Errors a user can fix. The CLI prints them as one line and exits with their code.

Exit codes (docs/batch-runs.md; the run summary records the same code):

    0    finished
    1    training started and could not finish: a non-finite loss or weights, a failed save,
         an image that could not be read any more (TrainingError, SaveError), or a bug (a
         Python traceback); the state to resume from, if any, is named in the message
    2    bad input: the config, data, model, checkpoint or output folder (ConfigError,
         DataError, ModelError, CheckpointError), or the output name is taken by another run;
         nearly always found before the first optimizer step, and running it again unchanged
         fails again
    130  stopped by SIGINT (Ctrl-C), 143 stopped by SIGTERM: 128 + the signal, the shell's
         convention; a state to resume from was saved unless the signal came twice
"""

from __future__ import annotations

from dataclasses import dataclass

EXIT_FINISHED = 0
EXIT_FAILED = 1
EXIT_BAD_INPUT = 2
EXIT_STOPPED_BY_USER = 130  # 128 + SIGINT, also a second Ctrl-C that does not wait for a save
STOPPED_BY_USER = "stopped by the user"


@dataclass(frozen=True)
class Problem:
    """One thing wrong with the input: what (the message, with its fix) and, where known, the
    file and the key it concerns (for ``--dry_run --json``)."""

    message: str
    file: str | None = None
    key: str | None = None

    def report(self) -> dict:
        return {"file": self.file, "key": self.key, "message": self.message}


class DifftuneError(Exception):
    """A problem in the user's input or environment, reported without a traceback.

    ``problems`` lists every problem the message reports (one error may name several); each
    says which file and key it concerns where that is known.
    """

    exit_code = EXIT_BAD_INPUT

    def __init__(
        self,
        message: str = "",
        *,
        file: str | None = None,
        key: str | None = None,
        problems: tuple[Problem, ...] = (),
    ):
        super().__init__(message)
        self.problems = tuple(problems) or (Problem(message, file, key),)


class ConfigError(DifftuneError):
    """A config key, value or file is wrong."""


class DataError(DifftuneError):
    """An image folder, image or caption file cannot be used."""


class ModelError(DifftuneError):
    """A model folder or weights file cannot be loaded."""


class CheckpointError(DifftuneError):
    """A saved state or network-weights file cannot be resumed from or loaded."""


class TrainingError(DifftuneError):
    """Training cannot continue (e.g. the loss became NaN); state was saved where possible."""

    exit_code = EXIT_FAILED


def exit_code_of(exc: BaseException | None) -> int:
    """The process exit code of a run that ended with ``exc`` (None: it finished).

    A DifftuneError carries its code (a stop by signal N: 128 + N); Ctrl-C that reaches Python as
    KeyboardInterrupt is 130; any other exception is a bug, and Python exits with 1 for it."""
    if exc is None:
        return EXIT_FINISHED
    if isinstance(exc, DifftuneError):
        return exc.exit_code
    if isinstance(exc, KeyboardInterrupt):
        return EXIT_STOPPED_BY_USER
    if isinstance(exc, SystemExit):
        return (
            exc.code
            if isinstance(exc.code, int)
            else (EXIT_FINISHED if exc.code is None else EXIT_FAILED)
        )
    return EXIT_FAILED


def exit_reason_of(exc: BaseException | None) -> str | None:
    """The one line the CLI prints for ``exc`` (after "error: " for a DifftuneError)."""
    if exc is None:
        return None
    if isinstance(exc, KeyboardInterrupt):
        return STOPPED_BY_USER
    text = str(exc).strip()
    if isinstance(exc, DifftuneError):
        # one error listing several problems: "<header>: <first>; <second>; ..."
        lines = [" ".join(line.split()) for line in text.splitlines() if line.strip()]
        return lines[0] + (" " + "; ".join(lines[1:]) if len(lines) > 1 else "")
    first = text.splitlines()[0] if text else ""
    return f"{type(exc).__name__}: {first}" if first else type(exc).__name__


def one_line(exc: BaseException) -> str:
    """An exception's first line, at most 200 characters, for one-line errors."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    text = lines[0] if lines else type(exc).__name__
    return text if len(text) <= 200 else text[:197] + "..."
