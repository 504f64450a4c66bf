"""Fixtures of the Qwen-Image-Edit tests: a tiny folder, our components, and diffusers'
QwenImageEditPipeline over the same folder with transformers' own Qwen2VLProcessor."""

from __future__ import annotations

import pytest

from library.models.families.qwenimage_edit.testkit import transformers_processor


@pytest.fixture(scope="session")
def edit_dir(tmp_path_factory):
    """A tiny Qwen-Image-Edit as a diffusers QwenImageEditPipeline folder (seed 0)."""
    from library.models.families.qwenimage_edit.tiny import write_tiny_qwenimage_edit_folder

    return write_tiny_qwenimage_edit_folder(tmp_path_factory.mktemp("models") / "tiny-edit")


@pytest.fixture(scope="session")
def edit_pipe(edit_dir):
    """diffusers' QwenImageEditPipeline read from edit_dir offline (the reference)."""
    from diffusers import QwenImageEditPipeline

    pipe = QwenImageEditPipeline.from_pretrained(
        edit_dir, processor=transformers_processor(edit_dir / "processor"), local_files_only=True
    )
    pipe.set_progress_bar_config(disable=True)
    return pipe


@pytest.fixture(scope="session")
def edit_components(edit_dir):
    """The folder as our loader reads it (float32)."""
    import torch

    from library.config.flow_schema import FlowSection
    from library.config.schema import ModelSection
    from library.models.loader import load_components

    model = ModelSection(pretrained_model_name_or_path=str(edit_dir))
    return load_components(model, torch.float32, FlowSection())


@pytest.fixture(scope="session")
def plus_dir(tmp_path_factory):
    """A tiny Qwen-Image-Edit-2509 as a diffusers QwenImageEditPlusPipeline folder (seed 0)."""
    from library.models.families.qwenimage_edit.tiny import write_tiny_qwenimage_edit_folder

    path = tmp_path_factory.mktemp("models") / "tiny-edit-plus"
    return write_tiny_qwenimage_edit_folder(path, plus=True)


@pytest.fixture(scope="session")
def plus_pipe(plus_dir):
    """diffusers' QwenImageEditPlusPipeline read from plus_dir offline (the reference)."""
    from diffusers import QwenImageEditPlusPipeline

    pipe = QwenImageEditPlusPipeline.from_pretrained(
        plus_dir, processor=transformers_processor(plus_dir / "processor"), local_files_only=True
    )
    pipe.set_progress_bar_config(disable=True)
    return pipe


@pytest.fixture(scope="session")
def plus_components(plus_dir):
    """The Plus folder as our loader reads it (float32)."""
    import torch

    from library.config.flow_schema import FlowSection
    from library.config.schema import ModelSection
    from library.models.loader import load_components

    model = ModelSection(pretrained_model_name_or_path=str(plus_dir))
    return load_components(model, torch.float32, FlowSection())
