"""Command-line entry of the LoRA toolbox: ``lora_tool.py <command> [options]``.

Each command lives in its own module of library.lora_tools, which provides ``HELP`` (one line),
``add_arguments(parser)`` and ``run(args) -> int``. Errors a user can fix are DifftuneErrors:
they print as one ``error:`` line and exit with their code.

Ctrl-C and SIGTERM stop a command by an exception, so the writes under way remove their
temporary files on the way out (exit 130 / 143); a command killed outright leaves them, and the
next command writing that output removes them (library/lora_tools/common.py ``writing``). A
command holds the lock of its output's name from the moment it checks --output to its end, so
a second command (or a training run) writing the same name is refused at once. A reader that
closes standard output early (``| head``) ends the command quietly.
"""

from __future__ import annotations

import argparse
import importlib
import os
import signal
import sys
from contextlib import contextmanager

from library.errors import DifftuneError
from library.third_party_noise import silence_unactionable_messages

# command -> module of library.lora_tools, in the order --help lists them.
COMMANDS = {
    "merge": "merge_into_model",
    "merge-loras": "merge_loras",
    "resize": "resize",
    "extract": "extract",
    "convert": "convert",
    "metadata": "metadata",
    "check": "check",
}


def _module(command: str):
    return importlib.import_module(f"library.lora_tools.{COMMANDS[command]}")


def build_parser() -> argparse.ArgumentParser:
    """The parser with one sub-parser per command."""
    parser = argparse.ArgumentParser(
        prog="lora_tool.py",
        description="Merge, resize, extract, convert, inspect and check LoRA / LyCORIS files.",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="command")
    for command in COMMANDS:
        module = _module(command)
        sub = commands.add_parser(command, help=module.HELP, description=module.HELP)
        module.add_arguments(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run one toolbox command; return the process exit code."""
    silence_unactionable_messages()
    args = build_parser().parse_args(sys.argv[1:] if argv is None else argv)
    try:
        with _terminate_by_exception():
            code = int(_module(args.command).run(args) or 0)
            sys.stdout.flush()  # a closed pipe shows here, not at the interpreter's exit
            return code
    except BrokenPipeError:
        return _reader_went_away()
    except DifftuneError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("stopped by the user", file=sys.stderr)
        return 130
    except Terminated:
        print("stopped by SIGTERM", file=sys.stderr)
        return 128 + int(signal.SIGTERM)
    finally:
        _release_outputs()


def _release_outputs() -> None:
    """Release the output locks the command took (library/lora_tools/common.py; not imported,
    and so holding none, when the command failed before it)."""
    common = sys.modules.get("library.lora_tools.common")
    if common is not None:
        common.release_outputs()


def _reader_went_away() -> int:
    """The reader of standard output closed it (``lora_tool.py metadata FILE | head``): end
    quietly, as a command killed by SIGPIPE does (128 + SIGPIPE), with standard output pointed
    at the null device so that the interpreter's last flush does not fail again."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
    return 128 + 13  # SIGPIPE's number on POSIX (signal.SIGPIPE does not exist on Windows)


class Terminated(BaseException):
    """SIGTERM arrived. A BaseException, like KeyboardInterrupt, so that no ``except
    Exception`` on the way out keeps the command going; ``finally`` blocks still run."""


def _raise_terminated(signum, frame) -> None:
    raise Terminated


@contextmanager
def _terminate_by_exception():
    """SIGTERM raises Terminated while inside (the default would end the process at once,
    leaving the temporary file of a write under way)."""
    try:
        previous = signal.signal(signal.SIGTERM, _raise_terminated)
        installed = True
    except ValueError:  # not the main thread: leave signals alone
        installed = False
    try:
        yield
    finally:
        if installed:
            signal.signal(signal.SIGTERM, previous)
