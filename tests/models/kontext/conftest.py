"""Fixtures of the FLUX.1 Kontext tests: a tiny folder on disk and diffusers' pipeline over it."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def kontext_dir(kit_folders):
    """A tiny FLUX.1 Kontext [dev] as a diffusers FluxKontextPipeline folder (seed 0), the
    session's kit folder."""
    return kit_folders("flux_kontext", "dev")


@pytest.fixture(scope="session")
def kontext_pipe(kontext_dir):
    """diffusers' FluxKontextPipeline read from kontext_dir offline (the reference)."""
    from diffusers import FluxKontextPipeline

    pipe = FluxKontextPipeline.from_pretrained(kontext_dir, local_files_only=True)
    pipe.set_progress_bar_config(disable=True)
    return pipe


@pytest.fixture(scope="session")
def kontext_components(kontext_dir):
    """The folder as our loader reads it (float32)."""
    import torch

    from library.config.flow_schema import FlowSection
    from library.config.schema import ModelSection
    from library.models.loader import load_components

    model = ModelSection(pretrained_model_name_or_path=str(kontext_dir))
    return load_components(model, torch.float32, FlowSection())
