"""Shared by the training tests: the tiny models' components, loaded once per test module."""

from __future__ import annotations

import pytest
import torch

from library.config.schema import ModelSection
from library.models.loader import load_components


def _components(model_dir):
    return load_components(
        ModelSection(pretrained_model_name_or_path=str(model_dir)), torch.float32
    )


@pytest.fixture(scope="module")
def sd1(tiny_model_dir):
    """The tiny SD1 components in float32 (tests must not change them)."""
    return _components(tiny_model_dir)


@pytest.fixture(scope="module")
def sdxl(tiny_sdxl_model_dir):
    """The tiny SDXL components in float32 (tests must not change them)."""
    return _components(tiny_sdxl_model_dir)
