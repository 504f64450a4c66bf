"""Fixtures of the Krea 2 tests: a tiny RAW folder on disk."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def krea2_dir(kit_folders):
    """A tiny Krea 2 RAW as a diffusers Krea2Pipeline folder (seed 0), the session's kit folder."""
    return kit_folders("krea2", "raw")
