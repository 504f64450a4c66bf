"""Fixtures of the sampling tests."""

from __future__ import annotations

import pytest
from sampling_helpers import load


@pytest.fixture
def components(tiny_model_dir):
    """The tiny SD 1.x model, loaded fresh (tests inject adapters and flip modes)."""
    return load(tiny_model_dir)


@pytest.fixture
def fresh_accelerate():
    """accelerate keeps process-wide singletons; start and leave them clean."""
    from accelerate.state import AcceleratorState, GradientState, PartialState

    def reset():
        AcceleratorState._reset_state(True)
        GradientState._reset_state()
        PartialState._reset_state()

    reset()
    yield
    reset()
