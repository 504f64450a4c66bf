"""Sample images during training: prompts files, samplers, generation, grids, cadence."""

from library.sampling.generate import SampleRound, sample_images
from library.sampling.prompts import SamplePrompt, load_prompts
from library.sampling.runner import SampleRunner, due_after_epoch, due_after_step

__all__ = [
    "SamplePrompt",
    "SampleRound",
    "SampleRunner",
    "due_after_epoch",
    "due_after_step",
    "load_prompts",
    "sample_images",
]
