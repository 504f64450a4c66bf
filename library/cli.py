"""Command-line entry: parse, load the config, print it or the plan, or train."""

from __future__ import annotations

import os
import sys

from library.errors import STOPPED_BY_USER, DifftuneError, exit_code_of
from library.host_allocator import keep_freed_host_memory
from library.plan_json import failure_document
from library.third_party_noise import silence_unactionable_messages, turn_off_loading_bars


def _is_main_process() -> bool:
    # Before accelerate starts, the launcher's RANK says which process prints errors.
    return os.environ.get("RANK", "0") == "0"


def main(argv: list[str] | None = None) -> int:
    """Run difftune; return the process exit code."""
    silence_unactionable_messages()  # before peft imports bitsandbytes
    if not _is_main_process():
        turn_off_loading_bars()
    keep_freed_host_memory()  # before the first large allocation
    # The rest is imported here: library.cli stays light to import (tests/tiers.py does in every
    # pytest session), and torch and the libraries that log on import load after the filters.
    from library.config.cli_args import parse_cli, wants_json
    from library.config.loader import load_config

    argv = sys.argv[1:] if argv is None else argv
    json_out = wants_json(argv)
    try:
        args = parse_cli(argv)
        config = load_config(args.config_paths, args.overrides, args.ignore_unknown_keys)
        if _is_main_process():
            for notice in config.notices:
                print(f"warning: {notice}", file=sys.stderr)
        if args.print_config:
            from library.config.render import render_toml

            print(render_toml(config), end="")
            return 0
        from library.training.trainer import Trainer

        trainer = Trainer(config)
        if args.json:  # --dry_run --json: the dry run's checks, then the plan as one JSON document
            from library.training.progress import print_plan_json

            print_plan_json(trainer)
            return 0
        trainer.run(dry_run=args.dry_run, config_files=args.config_paths)  # for the run summary
        return 0
    except DifftuneError as exc:
        if _is_main_process():
            print(f"error: {exc}", file=sys.stderr)
            if json_out:
                print(failure_document(exc))
        return exit_code_of(exc)
    except KeyboardInterrupt as exc:
        if _is_main_process():
            print(STOPPED_BY_USER, file=sys.stderr)
            if json_out:
                print(failure_document(exc))
        return exit_code_of(exc)
    except Exception as exc:  # a bug: the traceback goes to stderr, the JSON still to stdout
        if json_out and _is_main_process():
            print(failure_document(exc))
        raise


def exit_process(code: int) -> None:
    """End the process with ``code``. A process of a multi-process run ends with os._exit, after
    flushing its output: Python's normal teardown destroys the gloo process group, whose
    destructor joins worker threads while holding the GIL, and a worker that still has to
    release a Python tensor then waits for the GIL for ever (a hang at exit, seen under load).
    Every output was written, fsynced and agreed on before this point."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    sys.exit(code)


def main_entry() -> None:
    """Console-script entry (difftune-train)."""
    exit_process(main())
