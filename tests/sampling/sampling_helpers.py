"""Helpers of the sampling tests: loading the tiny model and writing small prompts."""

from __future__ import annotations

import numpy as np
import torch
from PIL import Image

from library.config.schema import ModelSection
from library.models.loader import load_components
from library.sampling.prompts import SamplePrompt


def load(model_dir):
    """Components of a tiny model folder in float32, as the trainer loads them."""
    section = ModelSection(pretrained_model_name_or_path=str(model_dir))
    return load_components(section, torch.float32)


def prompt(index: int, text: str = "a red square", **kw) -> SamplePrompt:
    """A 64 x 64, 2-step DDIM prompt; keywords override any field."""
    values = dict(
        index=index, prompt=text, negative_prompt="", width=64, height=64, seed=100 + index,
        steps=2, scale=7.5, sampler="ddim",
    )  # fmt: skip
    values.update(kw)
    return SamplePrompt(**values)


def pixels(path) -> np.ndarray:
    with Image.open(path) as img:
        return np.asarray(img.convert("RGB"), dtype=np.int16)


def prompts_of_a_round() -> list[SamplePrompt]:
    """Three prompts of different sizes and samplers."""
    return [
        prompt(0, seed=10),
        prompt(1, "a green circle", width=96, seed=11, sampler="euler_a"),
        prompt(2, "a blue line", height=80, seed=12),
    ]


def same(a: np.ndarray, b: np.ndarray) -> bool:
    """Equal images up to one level of rounding (8-bit pixels)."""
    return a.shape == b.shape and int(np.abs(a - b).max()) <= 1


def first_image(components, p, tmp_path, step=0, name="sample") -> np.ndarray:
    """The pixels of the first image of a sample round of prompt ``p`` at ``step``."""
    from library.sampling.generate import sample_images

    round_ = sample_images(
        components, [p], step=step, output_dir=tmp_path / "out", output_name=name
    )
    return pixels(round_.images[0])
