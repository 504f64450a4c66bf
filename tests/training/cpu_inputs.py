"""StepInputs for tests: a model's components on the CPU in float32, text encoders frozen."""

from __future__ import annotations

import torch

from library.training.step import StepInputs


def cpu_inputs(components, seed: int, unet=None, **options) -> StepInputs:
    """StepInputs over ``components`` (``unet`` replaces the UNet, e.g. a wrapper)."""
    c = components
    return StepInputs(
        unet=unet or c.unet,
        vae=c.vae,
        text_encoder=c.text_encoder,
        tokenizer=c.tokenizer,
        noise_scheduler=c.noise_scheduler,
        v_prediction=c.family.prediction_type == "v_prediction",
        train_text_encoder=False,
        weight_dtype=torch.float32,
        device=torch.device("cpu"),
        seed=seed,
        **options,
    )
