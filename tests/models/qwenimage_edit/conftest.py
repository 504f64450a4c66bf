"""Fixtures of the Qwen-Image-Edit tests: tiny folders of the first release and of 2509/2511
(Plus), our components, and diffusers' pipelines over the same folders with transformers' own
Qwen2VLProcessor."""

from __future__ import annotations

import pytest
import torch

from tests.kits.qwenimage_edit.kit import transformers_processor


def random_pixels(seed: int, height: int, width: int) -> torch.Tensor:
    """Two random 8-bit images as [2, 3, H, W] in [-1, 1] (exactly representable)."""
    generator = torch.Generator().manual_seed(seed)
    values = torch.randint(0, 256, (2, 3, height, width), generator=generator)
    return values.float() / 127.5 - 1


def _folder(tmp_path_factory, plus: bool):
    from tests.kits.qwenimage_edit.tiny import write_tiny_qwenimage_edit_folder

    path = tmp_path_factory.mktemp("models") / ("tiny-edit-plus" if plus else "tiny-edit")
    return write_tiny_qwenimage_edit_folder(path, plus=plus)


def _pipeline(folder, plus: bool):
    """diffusers' own pipeline of ``folder`` (the reference), read offline."""
    from diffusers import QwenImageEditPipeline, QwenImageEditPlusPipeline

    cls = QwenImageEditPlusPipeline if plus else QwenImageEditPipeline
    pipe = cls.from_pretrained(
        folder, processor=transformers_processor(folder / "processor"), local_files_only=True
    )
    pipe.set_progress_bar_config(disable=True)
    return pipe


def _components(folder):
    """The folder as our loader reads it (float32)."""
    from library.config.flow_schema import FlowSection
    from library.config.schema import ModelSection
    from library.models.loader import load_components

    model = ModelSection(pretrained_model_name_or_path=str(folder))
    return load_components(model, torch.float32, FlowSection())


@pytest.fixture(scope="session")
def edit_dir(tmp_path_factory):
    """A tiny Qwen-Image-Edit as a diffusers QwenImageEditPipeline folder (seed 0)."""
    return _folder(tmp_path_factory, plus=False)


@pytest.fixture(scope="session")
def edit_pipe(edit_dir):
    return _pipeline(edit_dir, plus=False)


@pytest.fixture(scope="session")
def edit_components(edit_dir):
    return _components(edit_dir)


@pytest.fixture(scope="session")
def plus_dir(tmp_path_factory):
    """A tiny Qwen-Image-Edit-2509 as a diffusers QwenImageEditPlusPipeline folder (seed 0)."""
    return _folder(tmp_path_factory, plus=True)


@pytest.fixture(scope="session")
def plus_pipe(plus_dir):
    return _pipeline(plus_dir, plus=True)


@pytest.fixture(scope="session")
def plus_components(plus_dir):
    return _components(plus_dir)


def sample_pair(components, pipe, tmp_path, seed: int, image_list: bool):
    """(our sample, the pipeline's) of one prompt with a 1024 x 1024 random reference (the
    pipelines' own reference size, so both read the same pixels) and true CFG, as [H, W, 3]
    int16 arrays. ``image_list``: the pipeline takes its references as a list (Plus)."""
    import numpy as np
    from PIL import Image

    from library.sampling.generate import sample_images
    from library.sampling.prompts import SamplePrompt

    pixels = np.random.default_rng(seed).integers(0, 256, (1024, 1024, 3), dtype=np.uint8)
    reference = tmp_path / "reference.png"
    Image.fromarray(pixels).save(reference)
    prompt = SamplePrompt(index=0, prompt="make it blue", negative_prompt="blurry", width=80,
                          height=64, seed=7, steps=2, scale=4.0, sampler=None,
                          references=(reference,))  # fmt: skip
    done = sample_images(components, [prompt], step=0, output_dir=tmp_path / "out",
                         output_name="s")  # fmt: skip
    with Image.open(done.images[0]) as img:
        ours = np.asarray(img.convert("RGB"), dtype=np.int16)
    image = Image.open(reference).convert("RGB")
    with torch.no_grad():
        theirs = pipe(
            image=[image] if image_list else image, prompt=prompt.prompt,
            negative_prompt=prompt.negative_prompt, true_cfg_scale=4.0, width=80, height=64,
            num_inference_steps=2, generator=torch.Generator().manual_seed(7),
        ).images[0]  # fmt: skip
    return ours, np.asarray(theirs.convert("RGB"), dtype=np.int16)
