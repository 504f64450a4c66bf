"""Whether a non-finite loss comes from the model's own weights.

The base model is checked only when a loss is NaN or infinite: reading every weight of a large
model at start-up would cost seconds to minutes on every run, and a finite loss shows there is
nothing to find. A model file holding NaN (a bad conversion, a broken merge) then gets a message
that names the file, instead of advice to lower the learning rate.
"""

from __future__ import annotations

import itertools

import torch

from library.data.content_hash import all_finite
from library.training.setup import TrainedParts
from library.training.sharding import local_part


def non_finite_model_weights(parts: TrainedParts, global_step: int, sharded: bool) -> list[str]:
    """Names ("<part>.<tensor>", the part as a diffusers subfolder) of the model's weights that
    are NaN or infinite: the frozen ones, and before the first optimizer step also the trained
    ones (still the base model's or network_weights'). Called on every process; ``sharded``:
    each checks its slices and all learn what any found."""
    comps = parts.components
    trained = {id(t) for t in parts.trained_weights().values()} if global_step else set()
    modules = [
        (comps.family.denoiser_subfolder, comps.denoiser),
        ("vae", comps.vae),
        *zip(comps.family.text_encoder_subfolders, comps.text_encoders, strict=True),
    ]
    broken = []
    for name, module in modules:
        for key, tensor in _named_tensors(module):
            if id(tensor) in trained or tensor is None or not tensor.is_floating_point():
                continue
            if not all_finite(local_part(tensor).detach()):
                broken.append(f"{name}.{key}")
    if sharded:
        found: list = [None] * torch.distributed.get_world_size()
        torch.distributed.all_gather_object(found, broken)
        broken = sorted({k for keys in found for k in keys})
    return broken


def _named_tensors(module: torch.nn.Module):
    """The module's parameters and buffers, and the weights blocks_to_swap keeps in host memory
    (library.training.block_swap.HostLinear: plain attributes, not parameters)."""
    yield from itertools.chain(module.named_parameters(), module.named_buffers())
    for path, layer in module.named_modules():
        if hasattr(layer, "host_weight"):
            yield f"{path}.weight", layer.host_weight
            yield f"{path}.bias", layer.host_bias
