"""Helpers for config tests: write TOML text into tmp_path and return its path as a string."""

from __future__ import annotations

import textwrap

import pytest


@pytest.fixture
def write_toml(tmp_path):
    """write_toml(name, text) -> str path of the file written under tmp_path."""

    def write(name: str, text: str) -> str:
        path = tmp_path / name
        path.write_text(textwrap.dedent(text), encoding="utf-8")
        return str(path)

    return write
