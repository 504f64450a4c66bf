"""Reading the TOML files a user points us at, with one-line errors that name them."""

from __future__ import annotations

import tomllib

from library.errors import ConfigError
from library.user_files import read_user_text


def read_toml(path: str, what: str = "config file") -> dict:
    """Parse a TOML file; ConfigError naming the file (and line) when it cannot be read or parsed."""
    text = read_user_text(path, what)
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"config error in {path}: not valid TOML: {e}", file=path) from None
