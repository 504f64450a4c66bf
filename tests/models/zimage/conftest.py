"""Fixtures of the Z-Image tests: a tiny Turbo folder on disk and diffusers' pipeline over it."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def zimage_dir(tmp_path_factory):
    """A tiny Z-Image-Turbo as a diffusers ZImagePipeline folder (seed 0)."""
    from tests.kits.zimage.tiny import write_tiny_zimage_folder

    return write_tiny_zimage_folder(tmp_path_factory.mktemp("models") / "tiny-zimage")


@pytest.fixture(scope="session")
def zimage_pipe(zimage_dir):
    """diffusers' ZImagePipeline read from zimage_dir offline (the reference computation)."""
    from diffusers import ZImagePipeline

    pipe = ZImagePipeline.from_pretrained(zimage_dir, local_files_only=True)
    pipe.set_progress_bar_config(disable=True)
    return pipe
