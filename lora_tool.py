"""Work on LoRA files after training: merge, resize, extract, convert, metadata, check.

    python lora_tool.py <command> --help

See docs/lora-tools.md. Every command prints one line and exits non-zero on bad input, and
never replaces an existing output unless given --overwrite.
"""

from library.lora_tools.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
