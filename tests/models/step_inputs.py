"""The trainer's StepInputs over loaded components, as the tests that compare a micro-batch loss
with a plain reference build them: float32 on the CPU, no text-encoder training."""

from __future__ import annotations

from collections.abc import Mapping

import torch

from library.config.schema import TrainingSection
from library.training.loss import LossOptions
from library.training.noise import NoiseOptions
from library.training.step import StepInputs


def step_inputs(components, seed: int, training: Mapping | None = None) -> StepInputs:
    """StepInputs of ``components`` with the keyed draws of ``seed`` and the noise and loss
    options of the [training] keys ``training``."""
    section = TrainingSection(**(training or {}))
    c = components
    return StepInputs(
        denoiser=c.denoiser, vae=c.vae, family=c.family, objective=c.objective,
        text_encoders=c.text_encoders, tokenizers=c.tokenizers, train_text_encoder=False,
        weight_dtype=torch.float32, device=torch.device("cpu"), seed=seed,
        noise=NoiseOptions.from_training(section), loss=LossOptions.from_training(section),
        image_encoder=c.image_encoder,
    )  # fmt: skip
