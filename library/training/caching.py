"""Building the latent and text-encoder caches before training, split across processes."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
from collections.abc import Callable, Sequence

import torch

from library.config.schema import Config
from library.data.cache_group import CacheGroup
from library.data.captions import process_caption
from library.data.content_hash import tensor_digest
from library.data.dataset import TrainData
from library.data.latent_cache import LatentCache
from library.data.samples import (
    cache_loader,
    image_state_requests,
    latent_requests,
    validation_caption,
)
from library.errors import ConfigError
from library.models.components import Components
from library.models.conditioning import encode_text
from library.saving.atomic import remove_stale_temporaries
from library.training.image_sizes import nearest_multiples
from library.training.text_cache import TextEncoderCache, text_identity
from library.training.text_sharding import sharded_text_encoders, shards_text_encoders

# Cached latents stay float32 whatever the training precision: a cached run then trains on the
# very numbers an uncached run computes.
LATENT_CACHE_DTYPE = torch.float32
# the name of a latent or text cache entry: a hex key
_CACHE_ENTRY = re.compile(r"[0-9a-f]{16,}\.safetensors")


def clear_killed_writes(data: TrainData, subfolder: str, accelerator) -> list:
    """Remove the temporary files that killed cache writes (kill -9, power loss) left in this
    run's cache folders (``<cache root>/<subfolder>``); a temporary that another live run is
    writing stays (library.saving.atomic.remove_stale_temporaries). Returns what was removed."""
    if not accelerator.is_local_main_process:
        return []  # one process per machine is enough; the others would find nothing left
    roots = {
        image.cache_root
        for scanned in data.scanned
        for image in (*scanned.images, *scanned.validation)
    }
    removed = [
        path
        for root in sorted(roots)
        for path in remove_stale_temporaries(root / subfolder, _CACHE_ENTRY.fullmatch)
    ]
    if removed:
        folders = ", ".join(sorted({str(path.parent) for path in removed}))
        accelerator.print(
            f"removed {len(removed)} unfinished cache file(s) that stopped runs left in {folders}"
        )
    return removed


def check_bucket_steps(config: Config, components: Components) -> None:
    """Bucket sides must fit the denoiser's downsampling (its family's ``bucket_grid``)."""
    need = components.family.bucket_grid(components.denoiser)
    for d, dataset in enumerate(config.datasets):
        steps = dataset.bucket_reso_steps
        if dataset.enable_bucket and steps % need:
            use = " or ".join(str(v) for v in nearest_multiples(steps, need))
            raise ConfigError(
                f"datasets[{d}].bucket_reso_steps = {steps} does not fit "
                f"{components.family.name}, whose denoiser needs sides that are multiples of "
                f"{need}; use {use}"
            )


def cache_group(config: Config, accelerator) -> CacheGroup:
    """The process group of cache building (one per run; creating it is collective)."""
    needed = config.data.latents_cached or config.data.text_cached
    return CacheGroup() if needed and accelerator.num_processes > 1 else CacheGroup.single()


def build_latent_cache(
    config: Config, data: TrainData, components: Components, accelerator, group: CacheGroup
) -> LatentCache | None:
    """Encode every image the run can use (both flips with flip_aug), or find it on disk: the
    posterior of the family's latent codec over the components' VAE."""
    if not config.data.latents_cached:
        return None
    if config.data.cache_latents_to_disk:
        clear_killed_writes(data, "latents", accelerator)
    device = accelerator.device
    codec = components.family.latent_codec(components.vae)

    def encode(pixels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        mean, std = codec.posterior(pixels.to(device))
        return mean.cpu(), std.cpu()

    cache = LatentCache(
        tensor_digest(components.vae),
        LATENT_CACHE_DTYPE,
        to_disk=config.data.cache_latents_to_disk,
        sample_dims=codec.layout.sample_dims,
    )
    requests = latent_requests(data, components.family.FIRST_FRAME_CONDITION)
    stats = cache.build(
        requests,
        encode,
        cache_loader(requests),
        config.data.vae_batch_size,
        rank=group.rank,
        world_size=group.world_size,
        group=group,
        progress=accelerator.is_local_main_process,
    )
    accelerator.print(
        f"latent cache: {stats.total} entries, {stats.reused} found cached, "
        f"{stats.encoded_here} encoded by this process"
    )
    return cache


def build_image_state_cache(
    config: Config, data: TrainData, components: Components, accelerator, group: CacheGroup
) -> LatentCache | None:
    """With the latent cache and an image encoder (Components.image_encoder): its states of
    every sample's first frame (image_state_request), encoded once or found on disk, keyed by
    the encoder's weights and its processor's settings; None otherwise."""
    encoder = components.image_encoder
    if encoder is None or not config.data.latents_cached:
        return None
    device = accelerator.device

    def encode(pixels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        states = encoder.pixel_states(pixels[:, :, 0] if pixels.dim() == 5 else pixels, device)
        states = states.float().cpu()
        return states, torch.zeros_like(states)  # the cache's std: states have none

    processor = json.dumps(encoder.processor.to_dict(), sort_keys=True, default=str)
    identity = f"image-states:{tensor_digest(encoder.model)}:{_digest(processor)}"
    cache = LatentCache(identity, LATENT_CACHE_DTYPE, config.data.cache_latents_to_disk, 2)
    requests = image_state_requests(data)
    stats = cache.build(
        requests, encode, cache_loader(requests), config.data.vae_batch_size, rank=group.rank,
        world_size=group.world_size, group=group, progress=accelerator.is_local_main_process,
    )  # fmt: skip
    accelerator.print(
        f"image encoder cache: {stats.total} entries, {stats.reused} found cached, "
        f"{stats.encoded_here} encoded by this process"
    )
    return cache


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _fixed_captions(data: TrainData) -> tuple[list[str], list]:
    """Captions known before training, with their cache folders: every caption of a subset
    without random caption operations, and every validation caption."""
    captions, roots = [], []
    for scanned in data.scanned:
        for image in scanned.images:
            options = scanned.options[image.subset].captions
            if not options.is_random:
                captions.append(
                    process_caption(image.item.caption, options, seed=0, epoch=0, position=0)
                )
                roots.append(image.cache_root)
        for image in scanned.validation:
            captions.append(validation_caption(image, scanned.options[image.subset]))
            roots.append(image.cache_root)
    return captions, roots


def build_text_cache(
    config: Config,
    data: TrainData,
    components: Components,
    weight_dtype,
    accelerator,
    group: CacheGroup,
    sharded: list | None = None,
) -> TextEncoderCache | None:
    """A text-encoder output cache, prefilled with every caption known before training.
    ``sharded``: the encoders' sharded copies (text_sharding.sharded_text_encoders) to encode
    with, every process in lockstep; the cache's identity is still the encoders' own."""
    if not config.data.text_cached:
        return None
    model = config.model
    family, encoders = components.family, tuple(components.text_encoders)
    identity = text_identity(
        family,
        encoders,
        model.clip_skip,
        model.max_token_length,
        weight_dtype,
        tokenizers=components.tokenizers,
    )
    to_disk = config.data.cache_text_encoder_outputs_to_disk
    if to_disk:
        clear_killed_writes(data, "text", accelerator)
    cache = TextEncoderCache(identity, to_disk=to_disk)
    if family.text_reads_references:
        # an entry is a caption read with its reference images: the training step encodes
        # each the first time a sample meets it (library.training.step)
        accelerator.print("text-encoder cache: captions are encoded with their references as met")
        return cache
    callers = encoders if sharded is None else tuple(sharded)

    def encode(captions: list[str]):
        with torch.no_grad():
            text = encode_text(
                family,
                components.tokenizers,
                callers,
                captions,
                accelerator.device,
                model.clip_skip,
                model.max_token_length,
            )
        return dataclasses.replace(
            text,
            hidden=text.hidden.to(weight_dtype),
            pooled=None if text.pooled is None else text.pooled.to(weight_dtype),
        )

    captions, roots = _fixed_captions(data)
    # Memory-only caches are filled by every process (each needs all of them), unless the
    # encoders are sharded (each process then encodes its share, and the entries are
    # exchanged); disk caches are shared out, then read back by every process.
    lockstep = group if sharded is not None else None
    shared = (to_disk or lockstep is not None) and group.world_size > 1
    encoded = cache.prefill(
        captions,
        roots,
        encode,
        config.data.vae_batch_size,
        rank=group.rank if shared else 0,
        world_size=group.world_size if shared else 1,
        progress=accelerator.is_local_main_process,
        lockstep=lockstep,
    )
    if shared and to_disk:
        group.barrier()
        cache.prefill(  # reads the others' files
            captions, roots, encode, config.data.vae_batch_size, lockstep=lockstep
        )
    accelerator.print(f"text-encoder cache: {len(set(captions))} captions, {encoded} encoded here")
    return cache


def build_text_cache_alone(
    config: Config,
    data: TrainData,
    components: Components,
    weight_dtype,
    accelerator,
    group: CacheGroup,
    then: Callable[[Sequence[torch.nn.Module]], None] | None = None,
) -> TextEncoderCache | None:
    """``build_text_cache`` with the text encoders brought to the device for it and moved back
    to host memory after (memory_estimate.text_encoders_leave_device: nothing else needs them);
    with fsdp_text_encoder over several processes, their sharded copies come to the device
    instead and are freed after (library/training/text_sharding.py); ``then(copies)`` is called
    with those copies after the fill, before they are freed (the sample prompts are encoded
    there: SampleRunner.encode_texts)."""
    world_size = accelerator.num_processes
    if shards_text_encoders(config, world_size):
        encoders = components.text_encoders
        with sharded_text_encoders(encoders, accelerator.device, world_size) as sharded:
            cache = build_text_cache(
                config, data, components, weight_dtype, accelerator, group, sharded
            )
            if then is not None:
                then(sharded)
            return cache
    for encoder in components.text_encoders:
        encoder.to(accelerator.device)
    try:
        return build_text_cache(config, data, components, weight_dtype, accelerator, group)
    finally:
        for encoder in components.text_encoders:
            encoder.to("cpu")
