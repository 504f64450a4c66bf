"""One micro-batch's training pass on *meta* copies of the models (shapes only, no memory, the
real modules untouched): what the memory estimate counts as activations (library/training/
memory_estimate.py), what the FLOP count runs (library/training/step_flops.py), and the VAE's
encoding peak."""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass

import torch

from library.config.schema import Config
from library.models.conditioning import assemble_conditioning, encode_text, plain_sizes
from library.models.families.base import (
    FIRST_FRAME_IMAGE_STATES_KEY,
    FIRST_FRAME_LATENTS_KEY,
    REFERENCE_LATENTS_KEY,
)
from library.training.activation_memory import (
    ActivationCounter,
    FusedAttention,
    LiveBytes,
    meta_copy,
)
from library.training.setup import WEIGHT_DTYPES, TrainedParts, uses_sdpa


@dataclass(frozen=True)
class TrainingSize:
    """One micro-batch: ``batch`` images (or clips of ``frames`` frames) of ``width`` x
    ``height`` pixels, each with reference images of the ``references`` sizes (width, height;
    edit models)."""

    width: int
    height: int
    batch: int
    references: tuple[tuple[int, int], ...] = ()
    frames: int = 1

    def pixel_shape(self, batch: int) -> tuple[int, ...]:
        """The shape of ``batch`` samples' pixels: [B, 3, H, W], or [B, 3, F, H, W] for clips."""
        clip = (self.frames,) if self.frames > 1 else ()
        return (batch, 3, *clip, self.height, self.width)


def _trained_denoiser(parts: TrainedParts) -> torch.nn.Module:
    """The denoiser whose training pass the estimate runs: the first trained expert, or the
    one denoiser (the experts have one shape)."""
    return next(iter(parts.experts.values()), parts.components.denoiser)


def training_activations(
    config: Config,
    parts: TrainedParts,
    size: TrainingSize,
    offloaded: bool = False,
    device_type: str = "cuda",
) -> int:
    """What one micro-batch of ``size`` keeps for backward on a device of ``device_type``: the
    trained text encoders' forward and the UNet's, run on meta copies through the trainer's own
    conditioning code. ``offloaded``: the checkpointed blocks' inputs are kept in host memory
    instead."""
    precision = config.training.mixed_precision
    dtype = WEIGHT_DTYPES[precision]
    counter = ActivationCounter(
        None if precision == "no" else dtype, not uses_sdpa(config), device_type == "cuda"
    )
    with counter.functions():
        meta_forward(config, parts, size, counter.watch)
    return counter.total - counter.boundaries if offloaded else counter.total


def meta_forward(
    config: Config,
    parts: TrainedParts,
    size: TrainingSize,
    watch=None,
    text_context=None,
    predict_context=None,
) -> torch.Tensor:
    """The trained path of one micro-batch of ``size`` on meta copies of the models (shapes
    only): the text encoders (with gradients when trained), then the denoiser's prediction,
    which is returned. ``watch(module)`` is called on each trained encoder's copy and on the
    denoiser's before they run; the captions are encoded inside ``text_context`` and the
    denoiser predicts inside ``predict_context`` (context managers, default none)."""
    comps = parts.components
    dtype = WEIGHT_DTYPES[config.training.mixed_precision]
    trained = {id(m) for _, m in parts.trained_modules()}
    encoders = [_meta_for_training(e, dtype, id(e) in trained) for e in comps.text_encoders]
    denoiser = _trained_denoiser(parts)
    denoiser = _meta_for_training(denoiser, dtype, id(denoiser) in trained)
    watch = watch or (lambda module: None)
    with torch.enable_grad():
        if parts.train_text_encoder:
            for encoder in encoders:
                watch(encoder)
        text_grads = nullcontext() if parts.train_text_encoder else torch.no_grad()
        with text_grads, text_context or nullcontext():
            text = encode_text(
                comps.family,
                comps.tokenizers,
                encoders,
                [""] * size.batch,
                "meta",
                config.model.clip_skip,
                config.model.max_token_length,
            )
        batch = plain_sizes(size.batch, size.height, size.width)
        batch |= _meta_references(comps, size, dtype) | _meta_first_frame(comps, size, dtype)
        cond = assemble_conditioning(comps.family, text, batch, "meta", dtype)
        watch(denoiser)
        latents, levels = _noisy_latents(comps, size, dtype)
        with predict_context or nullcontext():
            return comps.family.predict(
                denoiser, latents, comps.objective.model_time(levels), cond
            )


def encoding_bytes(parts: TrainedParts, size: TrainingSize, batch: int) -> int:
    """The most the VAE's encoding of ``batch`` images of ``size`` holds at once (it runs
    without gradients: its intermediates come and go), on a meta copy of the VAE. The VAE's
    attention is PyTorch's fused kernel whatever ``sdpa`` says (that is the denoiser's), so it
    counts its output alone."""
    comps = parts.components
    vae = meta_copy(comps.vae)
    codec = comps.family.latent_codec(vae)
    pixels = torch.empty(size.pixel_shape(batch), device="meta")
    with FusedAttention(), LiveBytes() as live:
        codec.posterior(pixels)
    return live.peak


def _noisy_latents(comps, size: TrainingSize, dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
    """Meta latents of the family's latent codec for the size ([B, C, H / f, W / f] for an image
    VAE, f its downscaling; a clip's latent frames on a video VAE's frame axis) and noise levels
    [B]."""
    layout = comps.family.latent_codec(comps.vae).layout
    shape = layout.shape(size.batch, size.height, size.width, size.frames)
    latents = torch.empty(shape, device="meta", dtype=dtype)
    levels = comps.objective.level_tensor(comps.objective.validation_levels(1), "meta")
    return latents, levels.expand(size.batch)


def _meta_references(comps, size: TrainingSize, dtype: torch.dtype) -> dict:
    """The batch entry of the size's reference latents, on the meta device (none: {}). The
    captions are encoded without the references: a text encoder that reads them is frozen, so
    keeps nothing for backward."""
    if not size.references:
        return {}
    layout = comps.family.latent_codec(comps.vae).layout
    latents = [
        torch.empty(layout.shape(size.batch, height, width), device="meta", dtype=dtype)
        for width, height in size.references
    ]
    return {REFERENCE_LATENTS_KEY: latents}


def _meta_first_frame(comps, size: TrainingSize, dtype: torch.dtype) -> dict:
    """The batch entry of the first-frame condition's latents (the sample's shape) and, with an
    image encoder, its states of that frame, on the meta device, for a family whose first frame
    conditions it (else {})."""
    if not comps.family.FIRST_FRAME_CONDITION:
        return {}
    latents, _ = _noisy_latents(comps, size, dtype)
    image = comps.image_encoder
    if image is None:
        return {FIRST_FRAME_LATENTS_KEY: latents}
    shape = (size.batch, image.tokens(), image.width)
    states = torch.empty(shape, device="meta", dtype=dtype)
    return {FIRST_FRAME_LATENTS_KEY: latents, FIRST_FRAME_IMAGE_STATES_KEY: states}


def _meta_for_training(module: torch.nn.Module, dtype: torch.dtype, trained: bool):
    copied = meta_copy(module, dtype)
    return copied.train() if trained else copied  # trained modules run in training mode
