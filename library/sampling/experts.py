"""Sampling a model with denoiser experts (library.models.experts) on its own pipeline: both
experts go in, each under the pipeline's argument for it, with the boundary the model gives
(``PipelineKind.expert_arguments``: diffusers' two-transformer video pipelines take the
high-noise expert as ``transformer``, the low-noise one as ``transformer_2`` and the split as
``boundary_ratio``), the run's own boundary (``timestep_boundary``) when it sets one, so samples
switch experts where training does. For the round, every expert is on the sampling device and in eval mode:
an expert a run does not train, or one waiting in host memory (offload_inactive_dit), comes in
and goes back after."""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Iterator

import torch

from library.models.experts import HIGH_NOISE, LOW_NOISE


def expert_arguments(components, kind, boundary: float | None = None) -> dict:
    """The pipeline constructor keywords of the model's experts (empty: no experts, or a
    pipeline that takes one denoiser), split at ``boundary`` (a fraction of the schedule),
    else at the model's boundary_ratio."""
    experts = getattr(components, "experts", None)  # stand-ins in tests may have no experts
    if experts is None or kind.expert_arguments is None:
        return {}
    high, low, split = kind.expert_arguments
    modules = experts.modules
    split_at = experts.boundary_ratio if boundary is None else boundary
    return {high: modules[HIGH_NOISE], low: modules[LOW_NOISE], split: split_at}


@contextlib.contextmanager
def experts_on(components, device) -> Iterator[None]:
    """Every expert's tensors on ``device`` and every expert in eval mode for the block; each
    tensor moved back where it was (its object kept: the optimizer and DDP point at it) and
    each submodule's training flag restored after."""
    experts = getattr(components, "experts", None)  # stand-ins in tests may have no experts
    modules = list(experts.modules.values()) if experts is not None else []
    moved = []
    flags = [(m, m.training) for module in modules for m in module.modules()]
    try:
        for tensor in itertools.chain(*(itertools.chain(m.parameters(), m.buffers())
                                        for m in modules)):  # fmt: skip
            if tensor.device != torch.device(device):
                moved.append((tensor, tensor.device))
                tensor.data = tensor.data.to(device)
        for module in modules:
            module.eval()
        yield
    finally:
        for tensor, where in moved:
            tensor.data = tensor.data.to(where)
        for m, training in flags:
            m.training = training
