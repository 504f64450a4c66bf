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
