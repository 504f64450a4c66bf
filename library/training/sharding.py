"""FSDP2 (PyTorch's ``fully_shard``): the denoiser split over the processes instead of copied.

Each block of the denoiser (and the rest of it, as one more unit) holds 1/N of its weights on
each of N processes; a unit's weights are gathered just before it computes and dropped again
after its forward pass ("full_shard") or after its backward pass ("shard_grad_op"). Trained
weights, their gradients and optimizer state stay sharded, so each process steps its own slice.

Everything that reads whole weights goes through this module: saves gather the trained weights,
the optimizer state and the EMA into the main process's host memory, one tensor at a time (so a
state or file is the same as an unsharded run's, and resumes with any process count), and a
resume cuts each full tensor back into this process's slice. Text encoders are not sharded
here: a trained one stays under DDP (frozen ones may be sharded for the text cache fill alone,
library/training/text_sharding.py).
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch import nn

# fsdp value -> reshard_after_forward for the blocks
RESHARD_AFTER_FORWARD = {"full_shard": True, "shard_grad_op": False}


def is_sharded(tensor: torch.Tensor) -> bool:
    """A DTensor: a slice of a tensor spread over the processes."""
    from torch.distributed.tensor import DTensor

    return isinstance(tensor, DTensor)


def local_part(tensor: torch.Tensor) -> torch.Tensor:
    """This process's slice of a sharded tensor; any other tensor as it is."""
    return tensor.to_local() if is_sharded(tensor) else tensor


def full_value(tensor: torch.Tensor, keep: bool) -> torch.Tensor | None:
    """The whole of ``tensor`` in host memory (a collective for a sharded one: every process
    calls it in the same order). ``keep`` False: take part in the gather and return None."""
    full = tensor.full_tensor() if is_sharded(tensor) else tensor
    return full.detach().cpu() if keep else None


def shard_like(
    full: torch.Tensor, like: torch.Tensor, dtype: torch.dtype | None = None
) -> torch.Tensor:
    """``full`` (the whole tensor, the same on every process) placed as ``like`` is: this
    process's slice when ``like`` is sharded, else ``full`` on ``like``'s device; in ``dtype``
    (default: ``like``'s)."""
    dtype = dtype or like.dtype
    if not is_sharded(like):
        return full.to(like.device, dtype)
    from torch.distributed.tensor import distribute_tensor

    full = full.to(like.device_mesh.device_type, dtype)
    # src_data_rank=None: every process already holds the whole tensor; nothing is sent
    return distribute_tensor(full, like.device_mesh, like.placements, src_data_rank=None)


def shard_units(denoiser: nn.Module) -> list[nn.Module]:
    """The denoiser's blocks, each sharded (gathered, freed) as one unit: every entry of its
    top-level ModuleLists (a UNet's down and up blocks, a transformer's blocks) and a UNet's
    mid block. What is left (embeddings, first and last layers) is the root unit."""
    units: list[nn.Module] = []
    for child in denoiser.children():
        if isinstance(child, nn.ModuleList):
            units.extend(child)
    mid = getattr(denoiser, "mid_block", None)
    if isinstance(mid, nn.Module):
        units.append(mid)
    return units


def sharded_weight_bytes(whole: int, units: Sequence[int], world_size: int) -> int:
    """Bytes on one device of a module of ``whole`` bytes sharded over ``world_size``
    processes as ``units`` (their bytes) and a root (the rest), each unit freed after its
    forward pass: its share, plus the root gathered throughout and two units gathered at once
    (the one computing and the next, fetched ahead)."""
    root = whole - sum(units)
    return math.ceil(whole / world_size) + root + sum(sorted(units, reverse=True)[:2])


def shard_denoiser(denoiser: nn.Module, mode: str, device: torch.device, world_size: int) -> None:
    """Apply fully_shard to each unit of ``denoiser`` (already on ``device``) and to the root,
    over all ``world_size`` processes."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh(device.type, (world_size,))
    reshard = RESHARD_AFTER_FORWARD[mode]
    for unit in shard_units(denoiser):
        fully_shard(unit, mesh=mesh, reshard_after_forward=reshard)
    # the root's layers run last in the forward pass and first in the backward pass: freeing
    # them in between would only gather them again at once
    fully_shard(denoiser, mesh=mesh, reshard_after_forward=False)


def set_gradient_sync(module: nn.Module, sync: bool) -> None:
    """Reduce-scatter the gradients in this backward pass (the accumulation window's last
    micro-batch) or keep accumulating them unsharded (the others)."""
    module.set_requires_gradient_sync(sync)


@dataclass
class _Swapped:
    owner: nn.Module
    name: str
    sharded: nn.Parameter


def _sharded_trained(modules: list[nn.Module]) -> list[_Swapped]:
    """Every sharded trained parameter of ``modules``, with the module that holds it."""
    found = []
    for module in modules:
        for owner in module.modules():
            for name, param in owner._parameters.items():
                if param is not None and param.requires_grad and is_sharded(param):
                    found.append(_Swapped(owner, name, param))
    return found


@contextmanager
def whole_trained_weights(modules: list[nn.Module]) -> Iterator[None]:
    """While inside, on every process: each sharded trained parameter of ``modules`` is a plain
    parameter holding its whole value on the device; what is changed inside is cut back into the
    slices on the way out. For code that needs whole tensors (max-norm of adapters whose norm
    spans every element). Every process must enter: the gathers are collectives."""
    items = _sharded_trained(modules)
    wholes = []
    for item in items:
        whole = nn.Parameter(item.sharded.full_tensor().detach(), requires_grad=True)
        item.owner._parameters[item.name] = whole
        wholes.append(whole)
    try:
        yield
    finally:
        with torch.no_grad():
            for item, whole in zip(items, wholes, strict=True):
                item.owner._parameters[item.name] = item.sharded
                item.sharded.copy_(shard_like(whole.detach(), item.sharded))


@contextmanager
def gathered_weights(modules: list[nn.Module], ema, keep: bool) -> Iterator[None]:
    """While inside: on the process with ``keep`` (the main one), every sharded trained
    parameter of ``modules`` is replaced by a plain parameter holding its whole value in host
    memory, and ``ema`` (a WeightAverage or None) holds whole averages for them, so writers read
    them as from an unsharded model. Every process must enter (the gathers are collectives);
    no forward pass may run inside. Frozen weights stay sharded: no writer reads them."""
    swapped: list[_Swapped] = []
    whole: dict[int, nn.Parameter] = {}
    for item in _sharded_trained(modules):
        full = full_value(item.sharded, keep)
        if keep:
            plain = nn.Parameter(full, requires_grad=True)
            whole[id(item.sharded)] = plain
            swapped.append(item)
            item.owner._parameters[item.name] = plain
    restore_ema = ema.gathered(whole, keep) if ema is not None else None
    try:
        if restore_ema is None:
            yield
        else:
            with restore_ema:
                yield
    finally:
        for item in swapped:
            item.owner._parameters[item.name] = item.sharded


def full_optimizer_state(optimizer: torch.optim.Optimizer, keep: bool) -> dict | None:
    """The optimizer's state_dict with every sharded tensor whole, in host memory, on the
    process with ``keep``; None on the others (which take part in the gathers)."""
    state = optimizer.state_dict()
    out: dict = {}
    for index in sorted(state["state"]):
        values = {}
        for key, value in state["state"][index].items():
            if isinstance(value, torch.Tensor) and is_sharded(value):
                value = full_value(value, keep)
            values[key] = value
        out[index] = values
    if not keep:
        return None
    return {"state": out, "param_groups": state["param_groups"]}


def sharded_optimizer_state(state: dict, params: list[torch.Tensor]) -> dict:
    """A saved (whole) optimizer state cut into this process's slices: each per-parameter
    tensor shaped like its sharded parameter is placed as the parameter is. ``params``: the
    optimizer's parameters in its own order (the state's integer keys index them)."""
    out = {}
    for index, values in state["state"].items():
        param = params[index]
        out[index] = {
            key: shard_like(value, param)
            if isinstance(value, torch.Tensor) and is_sharded(param) and value.shape == param.shape
            else value
            for key, value in values.items()
        }
    return {"state": out, "param_groups": state["param_groups"]}


def optimizer_params(optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
    """The optimizer's parameters in state_dict order."""
    return [p for group in optimizer.param_groups for p in group["params"]]


def shards(config, accelerator) -> bool:
    """Whether this run shards the denoiser: fsdp is set and there are several processes (one
    process has nothing to split with)."""
    return config.training.fsdp != "no" and accelerator.num_processes > 1


def shard_trained_denoiser(parts, mode: str, device: torch.device, world_size: int) -> None:
    """Shard ``parts``' denoiser (shard_denoiser) and point its parameter groups at the sharded
    parameters, which replace the originals (so the optimizer must be built after this)."""
    denoiser = parts.components.denoiser
    names = {id(p): name for name, p in denoiser.named_parameters()}
    shard_denoiser(denoiser, mode, device, world_size)
    sharded = dict(denoiser.named_parameters())
    for group in parts.param_groups:
        group["params"] = [sharded[names[id(p)]] if id(p) in names else p for p in group["params"]]
