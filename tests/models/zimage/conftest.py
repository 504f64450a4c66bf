"""Fixtures of the Z-Image tests: a tiny Turbo folder on disk and diffusers' pipeline over it."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def zimage_dir(kit_folders):
    """A tiny Z-Image-Turbo as a diffusers ZImagePipeline folder (seed 0): the session's kit
    folder, read only."""
    return kit_folders("zimage", "turbo")


@pytest.fixture(scope="session")
def zimage_pipe(zimage_dir):
    """diffusers' ZImagePipeline read from zimage_dir offline (the reference computation)."""
    from diffusers import ZImagePipeline

    pipe = ZImagePipeline.from_pretrained(zimage_dir, local_files_only=True)
    pipe.set_progress_bar_config(disable=True)
    return pipe
