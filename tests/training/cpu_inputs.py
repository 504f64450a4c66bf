"""Test helpers over a model's components: StepInputs on the CPU, and plain text encoding."""

from __future__ import annotations

import torch

from library.training.step import StepInputs


def cpu_inputs(components, seed: int, denoiser=None, **options) -> StepInputs:
    """StepInputs over ``components`` (``denoiser`` replaces theirs, e.g. a wrapper)."""
    c = components
    return StepInputs(
        denoiser=denoiser or c.denoiser,
        vae=c.vae,
        family=c.family,
        objective=c.objective,
        text_encoders=c.text_encoders,
        tokenizers=c.tokenizers,
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


# Two samples of a flow-matching step test: captions, loss weights, their keys.
FLOW_BATCH = {
    "captions": ["a red circle", "shape on gray"],
    "loss_weights": torch.tensor([1.0, 0.5]),
    "positions": torch.tensor([3, 8]),
    "epoch": 2,
}


def flow_pixels() -> torch.Tensor:
    """The pixels of FLOW_BATCH's two 48 x 64 images, in [-1, 1]."""
    return torch.rand(2, 3, 64, 48, generator=torch.Generator().manual_seed(5)) * 2 - 1
