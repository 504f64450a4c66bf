"""Gradient checkpointing with each checkpointed block's inputs kept in host memory (kohya's
``cpu_offload_checkpointing``).

With plain gradient checkpointing the device keeps, for backward, the input of every
checkpointed block (a UNet block, a transformer block) until the backward pass reaches it: for
a FLUX.1 transformer at 1024 px that is 57 copies of the image and text tokens. Offloading
copies each block's inputs to host memory as the block starts and back to the device when the
backward pass recomputes it, so the device holds the inputs of one block at a time, at the cost
of two host transfers per block and step. The arithmetic is unchanged: gradients are the same
as with plain checkpointing.

``offloaded_checkpoint`` has the signature diffusers' models call for checkpointing
(``enable_gradient_checkpointing(gradient_checkpointing_func=...)``). A run whose device is the
CPU has nothing to offload, and the function is plain checkpointing there.
"""

from __future__ import annotations

import torch
from torch.utils.checkpoint import checkpoint

HOST = torch.device("cpu")


def stash(values: tuple, store: torch.device = HOST) -> tuple:
    """``values`` with every tensor that is not on ``store`` copied there (others as they are)."""
    return tuple(
        v.to(store) if isinstance(v, torch.Tensor) and v.device != store else v for v in values
    )


def fetch(values: tuple, device: torch.device) -> tuple:
    """``values`` with every tensor copied to ``device`` (those already there as they are)."""
    return tuple(
        v.to(device, non_blocking=True) if isinstance(v, torch.Tensor) and v.device != device
        else v
        for v in values
    )  # fmt: skip


def compute_device(values: tuple) -> torch.device | None:
    """The accelerator the block runs on: the device of its first tensor input not in host
    memory, or None when every tensor input is on the CPU."""
    for v in values:
        if isinstance(v, torch.Tensor) and v.device != HOST:
            return v.device
    return None


def offloaded_checkpoint(module, *args, **kwargs):
    """Run ``module(*args, **kwargs)`` checkpointed, keeping its positional tensor inputs in
    host memory for the backward pass (keyword arguments stay where they are)."""
    device = compute_device(args)
    if device is None:
        return checkpoint(module.__call__, *args, use_reentrant=False, **kwargs)

    def run(*stored, **kwargs):
        return module(*fetch(stored, device), **kwargs)

    # The checkpoint keeps its inputs, the host copies, for the backward pass; the device
    # copies are freed as soon as the forward pass has used them.
    return checkpoint(run, *stash(args), use_reentrant=False, **kwargs)
