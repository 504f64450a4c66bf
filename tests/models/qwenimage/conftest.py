"""Fixtures of the Qwen-Image tests: a tiny folder on disk and diffusers' pipeline over it."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def qwenimage_dir(kit_folders):
    """A tiny Qwen-Image as a diffusers QwenImagePipeline folder (seed 0): the session's kit
    folder, read only."""
    return kit_folders("qwenimage", "qwenimage")


@pytest.fixture(scope="session")
def qwenimage_pipe(qwenimage_dir):
    """diffusers' QwenImagePipeline read from qwenimage_dir offline (the reference)."""
    from diffusers import QwenImagePipeline

    pipe = QwenImagePipeline.from_pretrained(qwenimage_dir, local_files_only=True)
    pipe.set_progress_bar_config(disable=True)
    return pipe


@pytest.fixture(scope="session")
def qwenimage_components(qwenimage_dir):
    """The folder as our loader reads it (float32)."""
    import torch

    from library.config.flow_schema import FlowSection
    from library.config.schema import ModelSection
    from library.models.families.qwenimage.load import load_qwenimage

    model = ModelSection(pretrained_model_name_or_path=str(qwenimage_dir))
    return load_qwenimage(model, FlowSection(), torch.float32, torch.float32)
