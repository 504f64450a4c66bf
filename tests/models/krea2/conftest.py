"""Fixtures of the Krea 2 tests: a tiny RAW folder on disk."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def krea2_dir(tmp_path_factory):
    """A tiny Krea 2 RAW as a diffusers Krea2Pipeline folder (seed 0)."""
    from tests.kits.krea2.tiny import write_tiny_krea2_folder

    return write_tiny_krea2_folder(tmp_path_factory.mktemp("models") / "tiny-krea2")
