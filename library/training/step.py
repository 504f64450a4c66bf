"""The loss of one micro-batch: encode, noise, predict, compare."""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from library.models import conditioning
from library.models.conditioning import Conditioning, encode_conditioning
from library.models.families.base import (
    CONDITIONING_DRAWS_KEY,
    FIRST_FRAME_IMAGE_STATES_KEY,
    FIRST_FRAME_LATENTS_KEY,
    REFERENCE_LATENTS_KEY,
    REFERENCE_PIXELS_KEY,
    ModelFamily,
)
from library.models.latent_codec import LatentCodec
from library.models.video_latent_codec import first_frame_pixels
from library.training.level_redraw import levels_in_range
from library.training.loss import LossOptions, diffusion_loss
from library.training.noise import (
    CONDITIONING_STREAM,
    NoiseOptions,
    keyed_uniforms,
    training_noise,
)
from library.training.objectives import Objective


@dataclass
class StepInputs:
    """What the loss needs besides the batch; built once by the trainer.

    ``noise`` and ``loss`` carry the noise and loss keys of the config (``NoiseOptions`` /
    ``LossOptions.from_training(config.training)``). Building it checks them against the
    objective (prediction type, timestep count).
    """

    denoiser: torch.nn.Module  # the prepared (possibly DDP-wrapped) module whose forward runs
    vae: torch.nn.Module
    family: ModelFamily
    objective: Objective
    # What conditions the denoiser: the family's text encoders (prepared where trained) and
    # tokenizers, in family.text_encoder_subfolders order.
    text_encoders: tuple[torch.nn.Module, ...]
    tokenizers: tuple[object, ...]
    train_text_encoder: bool
    weight_dtype: torch.dtype
    device: torch.device
    seed: int
    noise: NoiseOptions = field(default_factory=NoiseOptions)
    loss: LossOptions = field(default_factory=LossOptions)
    clip_skip: int | None = None
    max_token_length: int | None = None
    # Denoiser-only training with cache_text_encoder_outputs: a TextEncoderCache, else None.
    text_cache: object | None = None
    # A model with denoiser experts: the routing of each step (library.training.experts); its
    # modules are those whose forward runs, in place of ``denoiser``.
    experts: object | None = None
    # A model whose denoiser reads an image encoder's states of the first frame
    # (Components.image_encoder), else None.
    image_encoder: object | None = None

    def __post_init__(self) -> None:
        self.text_encoders = tuple(self.text_encoders)
        self.tokenizers = tuple(self.tokenizers)
        self.noise, self.loss = self.objective.check(self.noise, self.loss)

    @property
    def codec(self) -> LatentCodec:
        """The family's latent codec over ``vae``."""
        return self.family.latent_codec(self.vae)


def batch_posterior(s: StepInputs, batch: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """The VAE posterior's (mean, std) in float32, in the codec's layout ([B, C, h, w] for an
    image VAE): cached in the batch ("latent_means"/"latent_stds", see library.data.dataset) or
    encoded from its pixels."""
    if "latent_means" in batch:
        mean = batch["latent_means"].to(s.device, dtype=torch.float32)
        return mean, batch["latent_stds"].to(s.device, dtype=torch.float32)
    return s.codec.posterior(batch["pixel_values"].to(s.device))


def with_references(s: StepInputs, batch: dict) -> dict:
    """``batch`` with the entries a family that takes reference images reads (see
    families.base): each reference's latents, from its cached posterior mean or encoded from
    its pixels (the reference pipelines encode with the posterior's mode), and, for a family
    whose text encoder reads them, their pixels on the device. Unchanged without references."""
    if "reference_means" in batch:
        means = [m.to(s.device, dtype=torch.float32) for m in batch["reference_means"]]
    elif "reference_pixels" in batch:
        means = [s.codec.posterior(p.to(s.device))[0] for p in batch["reference_pixels"]]
    else:
        return batch
    entries = {REFERENCE_LATENTS_KEY: [s.codec.to_latents(mean) for mean in means]}
    if s.family.text_reads_references:
        entries[REFERENCE_PIXELS_KEY] = [p.to(s.device) for p in batch["reference_pixels"]]
    return {**batch, **entries}


def with_first_frame(s: StepInputs, batch: dict) -> dict:
    """``batch`` with the first-frame condition's latents (FIRST_FRAME_LATENTS_KEY) for a family
    whose FIRST_FRAME_CONDITION: from the cached posterior mean, or encoded from the pixels (a
    clip's first frame followed by zeros; an image is its own), the mode as the pipelines
    encode it. Unchanged for other families."""
    if not s.family.FIRST_FRAME_CONDITION:
        return batch
    if "first_frame_means" in batch:
        mean = batch["first_frame_means"].to(s.device, dtype=torch.float32)
    else:
        pixels = batch["pixel_values"].to(s.device)
        mean = s.codec.posterior(first_frame_pixels(pixels) if pixels.dim() == 5 else pixels)[0]
    return with_image_states(s, {**batch, FIRST_FRAME_LATENTS_KEY: s.codec.to_latents(mean)})


def with_image_states(s: StepInputs, batch: dict) -> dict:
    """``batch`` with the image encoder's states of each sample's first frame
    (FIRST_FRAME_IMAGE_STATES_KEY): cached ("first_frame_states"), or encoded from the first
    frame's pixels. Unchanged without an image encoder."""
    if s.image_encoder is None:
        return batch
    if "first_frame_states" in batch:
        states = batch["first_frame_states"].to(s.device)
    else:
        pixels = batch["pixel_values"]
        states = s.image_encoder.pixel_states(pixels[:, :, 0] if pixels.dim() == 5 else pixels,
                                              s.device)  # fmt: skip
    return {**batch, FIRST_FRAME_IMAGE_STATES_KEY: states}


def with_image_inputs(s: StepInputs, batch: dict) -> dict:
    """``batch`` with the image inputs the family's conditioning reads besides the caption: the
    reference images' and the first frame's latents (with_references, with_first_frame)."""
    return with_first_frame(s, with_references(s, batch))


def _text_keys(batch: dict) -> list[str]:
    """What the text cache knows each sample's text input by: its caption, and for a family
    whose text encoder reads the references, their identities too."""
    ids = batch.get("reference_ids")
    if ids is None:
        return list(batch["captions"])
    return [
        f"{caption}\n[references: {', '.join(refs)}]"
        for caption, refs in zip(batch["captions"], ids, strict=True)
    ]


def batch_conditioning(s: StepInputs, batch: dict) -> Conditioning:
    """The denoiser's conditioning of the batch's captions (and SDXL sizes, and reference
    images where the family takes them: ``with_references`` first), from the text-encoder
    cache when there is one."""
    if s.family.text_reads_references and s.text_cache is not None:
        return _cached_with_references(s, batch)
    if s.text_cache is not None:

        def encode(captions: list[str]):
            with torch.no_grad():
                return conditioning.encode_text(
                    s.family,
                    s.tokenizers,
                    s.text_encoders,
                    captions,
                    s.device,
                    s.clip_skip,
                    s.max_token_length,
                )

        captions = list(batch["captions"])
        text = s.text_cache.get(captions, batch.get("cache_roots"), encode)
        text.mask = s.family.text_mask(s.tokenizers, captions, s.device)  # never cached
        return conditioning.assemble_conditioning(s.family, text, batch, s.device, s.weight_dtype)
    grad_context = nullcontext() if s.train_text_encoder else torch.no_grad()
    with grad_context:
        return encode_conditioning(
            s.family,
            s.tokenizers,
            s.text_encoders,
            batch["captions"],
            s.device,
            batch,
            s.weight_dtype,
            s.clip_skip,
            max_token_length=s.max_token_length,
        )


def _cached_with_references(s: StepInputs, batch: dict) -> Conditioning:
    """batch_conditioning from the text cache for a family whose text encoder reads the
    reference images: the cache knows an entry by its caption and its references' identities
    (``_text_keys``)."""
    keys = _text_keys(batch)

    def encode(missing: list[str]):
        rows = [keys.index(key) for key in missing]
        with torch.no_grad():
            return s.family.encode_text_with_references(
                s.tokenizers,
                s.text_encoders,
                [batch["captions"][i] for i in rows],
                [pixels[rows] for pixels in batch[REFERENCE_PIXELS_KEY]],
                s.device,
            )

    text = s.text_cache.get(keys, batch.get("cache_roots"), encode)
    text.mask = s.family.text_mask(s.tokenizers, list(batch["captions"]), s.device)  # never cached
    return conditioning.assemble_conditioning(s.family, text, batch, s.device, s.weight_dtype)


def latent_mask(batch: dict, latent_shape: torch.Size) -> torch.Tensor | None:
    """The batch's alpha masks [B, 1, H, W] averaged down to the latents' spatial size (their
    last two axes), with a 1 for every other latent axis so it broadcasts over them; or None."""
    masks = batch.get("alpha_masks")
    if masks is None:
        return None
    mask = F.interpolate(masks.float(), size=tuple(latent_shape[-2:]), mode="area")
    return mask.view(mask.shape[0], *([1] * (len(latent_shape) - 3)), *mask.shape[-2:])


def predict(
    s: StepInputs, noisy: torch.Tensor, levels: torch.Tensor, cond: Conditioning, denoiser=None
):
    """The objective's prediction for latents noised to ``levels``: the denoiser (unset:
    ``s.denoiser``) runs on the noisy latents in the weight dtype."""
    output = s.family.predict(
        denoiser or s.denoiser, noisy.to(s.weight_dtype), s.objective.model_time(levels), cond
    )
    return s.objective.prediction(output, noisy, levels)


def micro_batch_loss(s: StepInputs, batch: dict) -> torch.Tensor:
    """Loss of one micro-batch, with every random draw keyed by (seed, epoch, position); on a
    model with experts, that of the expert of the optimizer step the trainer set in
    ``s.experts.step`` (library.training.experts)."""
    mean, std = batch_posterior(s, batch)
    positions = batch["positions"].tolist()
    shape = tuple(mean.shape[1:])
    draws = s.objective.draws(s.seed, batch["epoch"], positions, shape, s.device, s.noise)
    latents = s.codec.to_latents(mean + std * draws.latent_eps)
    noise, input_noise = training_noise(draws, latents, s.noise)
    denoiser = None
    key = (s.seed, batch["epoch"], positions)
    if s.experts is None:
        levels = levels_in_range(s.objective, draws, shape, key)
    else:
        expert = s.experts.choose(s.objective, draws, shape, s.seed)
        levels = s.experts.levels_within(s.objective, draws, shape, key, expert)
        denoiser = s.experts.module(expert, s.device)
    noisy = s.objective.noisy(latents, input_noise, levels)
    if s.family.conditioning_draws:
        draws = keyed_uniforms(
            s.seed, batch["epoch"], positions, s.family.conditioning_draws, CONDITIONING_STREAM,
            s.device,
        )  # fmt: skip
        batch = {**batch, CONDITIONING_DRAWS_KEY: draws}
    cond = batch_conditioning(s, with_image_inputs(s, batch))
    prediction = predict(s, noisy, levels, cond, denoiser)
    return diffusion_loss(
        prediction,
        s.objective.target(latents, noise, levels),
        levels,
        batch["loss_weights"],
        s.loss,
        s.objective,
        latent_mask(batch, latents.shape),
    )
