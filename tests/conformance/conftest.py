"""Fixtures of the conformance suites."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="module")
def read_pipeline():
    """(folder, kit) -> diffusers' own reading of the folder (test_family_conformance.pipeline),
    read once per test module and shared by the tests that only read it: its modules' weights
    and configs, its tokenizers, its modules run without gradients. A test that changes the
    pipeline (loads or fuses a LoRA into it) reads its own with ``pipeline``."""
    from tests.conformance.test_family_conformance import pipeline

    pipes = {}

    def read(folder: Path, kit):
        key = (Path(folder), id(kit))
        if key not in pipes:
            pipes[key] = pipeline(folder, kit)
        return pipes[key]

    return read
