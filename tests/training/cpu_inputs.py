"""Test helpers over a model's components: StepInputs on the CPU, and plain text encoding."""

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


def plain_text_states(components, captions: list[str]) -> torch.Tensor:
    """The text encoder's last hidden states for captions padded to 77 tokens, written with plain
    transformers calls (an independent reference for the trainer's text path)."""
    ids = components.tokenizer(
        captions, padding="max_length", max_length=77, truncation=True, return_tensors="pt"
    ).input_ids
    return components.text_encoder(ids)[0]
