"""Command-line entry of the LoRA toolbox: ``lora_tool.py <command> [options]``.

Each command lives in its own module of library.lora_tools, which provides ``HELP`` (one line),
``add_arguments(parser)`` and ``run(args) -> int``. Errors a user can fix are DifftuneErrors:
they print as one ``error:`` line and exit with their code.
"""

from __future__ import annotations

import argparse
import importlib
import sys

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
    from library.third_party_noise import silence_unactionable_messages

    silence_unactionable_messages()
    from library.errors import DifftuneError

    args = build_parser().parse_args(sys.argv[1:] if argv is None else argv)
    try:
        return int(_module(args.command).run(args) or 0)
    except DifftuneError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("stopped by the user", file=sys.stderr)
        return 130
