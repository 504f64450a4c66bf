"""FSDP2 over the frozen text encoders while they fill the text cache (fsdp_text_encoder).

A text encoder larger than one device (a 24B language model) is split over the N
processes for the cache fill only: a sharded copy of it is made per process, one unit per layer
of its layer lists (a transformers model's decoder or encoder layers, a vision tower's too) and
the rest (embeddings, final norms, heads) as the root unit, so each device holds 1/N of the
weights plus the units that compute (a layer is gathered just before it runs and freed after).
The processes encode their own shares of the captions; every call of a sharded encoder is a
collective, so they make the same number of calls, the shorter shares padded with calls whose
output is dropped (TextEncoderCache.prefill's ``lockstep``). The copy is dropped after the fill;
the encoder itself is never changed (its whole weights stay in host memory, where they were
loaded), so its identity, and the cache, are those of an unsharded fill.

Nothing may call the encoder after the fill, so the word needs what lets the fill be the only
use: cached outputs, frozen encoders, captions fixed before training, no reference images read
with the text (check_text_sharding says so before any weight is read). The sample prompts,
read once when the run starts, are encoded by the sharded copies right after the fill, every
process encoding every prompt, and the rounds use those states (library/sampling/texts.py).
"""

from __future__ import annotations

import gc
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import torch
from torch import nn

from library.config.schema import Config
from library.data.captions import CaptionOptions
from library.errors import ConfigError
from library.training.activation_memory import meta_copy
from library.training.sharding import shard_like, sharded_weight_bytes

WORD = "fsdp_text_encoder = true"


def shards_text_encoders(config: Config, world_size: int) -> bool:
    """Whether this run shards its text encoders for the cache fill (the word, and several
    processes to split them over)."""
    return config.training.fsdp_text_encoder and world_size > 1


def layer_units(encoder: nn.Module) -> list[nn.Module]:
    """The encoder's layers, each sharded as one unit: the entries of its outermost
    ModuleLists that hold weights (a layer's own lists, such as T5's sublayers, stay inside
    it). What is left (embeddings, norms, heads) is the root unit."""
    units: list[nn.Module] = []

    def visit(module: nn.Module) -> None:
        for child in module.children():
            if isinstance(child, nn.ModuleList):
                units.extend(m for m in child if next(m.parameters(), None) is not None)
            else:
                visit(child)

    visit(encoder)
    return units


def text_caching_bytes(encoder: nn.Module, world_size: int, module_bytes) -> int:
    """One sharded text encoder's bytes on a device while it fills the cache
    (``module_bytes``: the estimate's count of a module)."""
    units = [module_bytes(unit) for unit in layer_units(encoder)]
    return sharded_weight_bytes(module_bytes(encoder), units, world_size)


def sharded_copy(encoder: nn.Module, device: torch.device, world_size: int) -> nn.Module:
    """A copy of ``encoder`` sharded over the ``world_size`` processes on ``device`` (module
    docstring); ``encoder`` is not changed. Built on the meta device, then each weight is cut
    from the whole one in turn, so no device ever holds more than one whole weight at once."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh(device.type, (world_size,))
    copy = meta_copy(encoder)
    for unit in layer_units(copy):
        fully_shard(unit, mesh=mesh, reshard_after_forward=True)
    fully_shard(copy, mesh=mesh, reshard_after_forward=True)
    _keep_output_recording(copy)
    copy.to_empty(device=device)
    weights = dict(encoder.named_parameters())
    buffers = dict(encoder.named_buffers())
    with torch.no_grad():
        for name, param in copy.named_parameters():
            param.copy_(shard_like(weights[name].detach(), param))
        for name, buffer in copy.named_buffers():  # not sharded: each process holds them whole
            buffer.copy_(buffers[name])
    copy.eval()
    copy.requires_grad_(False)
    return copy


def _keep_output_recording(copy: nn.Module) -> None:
    """transformers (5.x) records a model's hidden states by hooks it looks up under the model's
    class name, and fully_shard gives the sharded module a class of its own (FSDP<class>): the
    copy is registered under that name too, so ``output_hidden_states`` still gives them."""
    try:
        from transformers.utils.output_capturing import _CAN_RECORD_REGISTRY
    except ImportError:  # a transformers without the registry looks at the module itself
        return
    recorded = getattr(copy, "_can_record_outputs", None)
    if recorded is not None:
        _CAN_RECORD_REGISTRY[copy] = recorded


@contextmanager
def sharded_text_encoders(
    encoders: Sequence[nn.Module], device: torch.device, world_size: int
) -> Iterator[list[nn.Module]]:
    """While inside: sharded copies of ``encoders`` (sharded_copy), which every process must
    call alike; their device memory is freed on the way out."""
    copies = [sharded_copy(encoder, device, world_size) for encoder in encoders]
    try:
        yield copies
    finally:
        copies.clear()
        gc.collect()  # FSDP's hooks hold the copies in reference cycles
        if device.type == "cuda":
            torch.cuda.empty_cache()


def check_text_sharding(config: Config, entry, family: type, world_size: int) -> list[str]:
    """With ``fsdp_text_encoder``: ConfigError (one line, before any weight is read) where a
    text encoder would be needed after the cache fill, which the sharded encoders cannot serve
    (module docstring); the note to show where one process has nothing to shard with.
    ``entry``: the model's registry entry, ``family`` its ModelFamily class."""
    if not config.training.fsdp_text_encoder:
        return []
    net, data = config.network, config.data
    if net.train_mode == "lora" and not net.network_train_unet_only:
        raise ConfigError(
            f"{WORD} shards frozen text encoders for the text cache, and "
            "network_train_unet_only = false trains them: set network_train_unet_only = true "
            "or remove fsdp_text_encoder"
        )
    if not data.text_cached:
        raise ConfigError(
            f"{WORD} shards the text encoders while they fill the text cache, and there is "
            "none: set cache_text_encoder_outputs = true or remove fsdp_text_encoder"
        )
    for d, dataset in enumerate(config.datasets):
        for j, subset in enumerate(dataset.subsets):
            if CaptionOptions.from_subset(subset).is_random:
                raise ConfigError(
                    f"{WORD}: datasets[{d}].subsets[{j}] varies its captions (shuffle, "
                    "dropout, wildcards or token warmup), so the text encoders would encode "
                    "during training, after their sharded copies are freed: fix the captions "
                    "or remove fsdp_text_encoder"
                )
    reads = entry.edit.text_reads_references if entry.edit else family.TEXT_READS_REFERENCES
    if reads:
        raise ConfigError(
            f"{WORD}: {entry.label}'s text encoder reads each caption with its reference "
            "images during training, after the cache fill: remove fsdp_text_encoder"
        )
    if world_size == 1:
        return [
            f"{WORD} has no effect with one process (nothing to shard with): the text "
            "encoders fill the cache whole"
        ]
    return []
