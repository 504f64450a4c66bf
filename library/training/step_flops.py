"""Model FLOPs of a training step, counted on meta copies of the models.

A step's model FLOPs are what its micro-batches' forward and backward passes compute: the
denoiser's, the trained text encoders', and the frozen text encoders' forward where their
outputs are not cached. Gradient checkpointing's second forward pass is work the hardware does
but not model FLOPs, so it is left out, as model-FLOPs utilisation (MFU) conventionally counts.
The VAE's encoding is left out too (cached, or not part of what the step trains).

PyTorch's FlopCounterMode counts the matrix products and convolutions (and attention) of the
meta forward and backward passes from their shapes, so a full-size model's count takes seconds
and no memory.
"""

from __future__ import annotations

import torch
from torch.utils.flop_counter import FlopCounterMode

from library.config.schema import Config
from library.training.meta_activations import TrainingSize, meta_forward
from library.training.setup import TrainedParts


def _recompute_nothing(module: torch.nn.Module) -> None:
    """Run ``module``'s checkpointed regions once, as plain calls."""
    for sub in module.modules():
        if getattr(sub, "_gradient_checkpointing_func", None) is not None:
            sub._gradient_checkpointing_func = _call


def _call(function, *args, **kwargs):
    return function(*args, **kwargs)


def micro_batch_flops(config: Config, parts: TrainedParts, size: TrainingSize) -> int:
    """Model FLOPs of one micro-batch of ``size`` (see the module docstring)."""
    # three counters: a FlopCounterMode starts from zero each time it is entered
    text, forward, backward = (FlopCounterMode(display=False) for _ in range(3))
    prediction = meta_forward(config, parts, size, _recompute_nothing, text, forward)
    with backward:
        prediction.float().square().mean().backward()
    flops = forward.get_total_flops() + backward.get_total_flops()
    # the frozen encoders' forward counts where it runs in every step
    if parts.train_text_encoder or not config.data.text_cached:
        flops += text.get_total_flops()
    return flops


def step_flops(config: Config, parts: TrainedParts, size: TrainingSize) -> int:
    """Model FLOPs of one optimizer step on one process: its micro-batches of ``size``."""
    return config.training.gradient_accumulation_steps * micro_batch_flops(config, parts, size)
