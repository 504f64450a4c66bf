"""Reading text files the user points us at, with one-line errors that name them."""

from __future__ import annotations

from pathlib import Path

from library.errors import ConfigError


def read_user_text(path: str | Path, what: str) -> str:
    """The UTF-8 text of ``path`` (a leading BOM dropped); ConfigError naming ``what`` and the file."""
    try:
        return Path(path).read_text(encoding="utf-8-sig")
    except FileNotFoundError:
        raise ConfigError(f"{what} not found: {path}") from None
    except IsADirectoryError:
        raise ConfigError(f"{what} {path} is a folder, not a file") from None
    except OSError as e:
        raise ConfigError(f"cannot read {what} {path}: {e.strerror}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{what} {path}: not UTF-8 text") from None
