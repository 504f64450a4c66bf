"""Shared by the config tests: the one-line error a config load stops with."""

from __future__ import annotations

import pytest

from library.config.loader import load_config
from library.errors import ConfigError


def error_of(path: str, overrides=()) -> str:
    """The ConfigError message loading ``path`` (plus overrides) raises; it must be one line."""
    with pytest.raises(ConfigError) as info:
        load_config(path, overrides)
    message = str(info.value)
    assert "\n" not in message
    return message
