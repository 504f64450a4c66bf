"""FLUX.2 (klein 4B / 9B, base and distilled; dev) as a ModelFamily: what the trainer asks
(docs/flux2.md; diffusers 0.42.1's Flux2KleinPipeline, Flux2Pipeline, Flux2Transformer2DModel).

Latents: the patched codec's 128 channels, a token per latent pixel at ids (0, row, column, 0);
text: the encoder's states of three layers (spec.TEXT_LAYERS) joined per token for the caption
as a chat turn (klein: Qwen3, thinking off; dev: Mistral 3 after FLUX.2's system message), 512
tokens all attended, at ids (0, 0, 0, k); timestep: the scheduler's (spec.py's objective), dev
with its distilled guidance value; reference k's tokens after the image's at T = 10 (k + 1).
Only the transformer trains (as musubi-tuner and ai-toolkit); LoRA files: names.py.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import ClassVar

import torch

from library.config.flow_section import FlowSection
from library.config.model_schema import ModelSection
from library.errors import ConfigError
from library.models.components import Components
from library.models.conditioning import Conditioning, TextConditioning
from library.models.families.base import reference_latents
from library.models.families.flux2.names import TABLE
from library.models.families.flux2.sampling import REFERENCES, flux2_pipeline_kind
from library.models.families.flux2.spec import (
    DISTILLED_KEY,
    DRAW,
    MAX_TOKENS,
    REFERENCE_T_STEP,
    SCHEDULER_CONFIG,
    SPECS,
    TEXT_LAYERS,
    Flux2FlowObjective,
    model_of,
)
from library.models.families.spec_loader import (
    claimer,
    components,
    folder_scheduler,
    load_spec,
    spec_for,
)
from library.models.families.transformer_family import TransformerFamily, swappable_tails
from library.models.patch_tokens import lattice_ids
from library.models.patched_latent_codec import BatchNormPatchedCodec
from library.models.text_encoders import hidden_states, mistral3, qwen3
from library.networks.table_modules import top_modules

log = logging.getLogger(__name__)
DISTILLED_NOTE = (
    "a step-distilled checkpoint: LoRAs trained on it are reported to collapse; train on "
    "FLUX.2 [klein] base (FLUX.2-klein-base-4B / -9B) and sample the LoRA on either"
)


@dataclass(frozen=True, kw_only=True)
class Flux2Family(TransformerFamily):
    """A FLUX.2 model: ``model`` "klein" or "dev", ``size`` ("4b", "9b", "32b"), ``distilled``."""

    FLOW_KIND: ClassVar[str] = "flux2"
    LABEL: ClassVar[str] = "FLUX.2"
    DENOISER_ONLY_ADAPTERS: ClassVar[str | None] = (
        "no text-encoder adapters, as musubi-tuner and ai-toolkit"
    )

    # no trainer reads kohya's split_qkv for FLUX.2: q, k and v train apart here (docs/flux2.md
    # says how that differs from musubi-tuner's one adapter on the fused qkv)
    SPLIT_QKV_NOTE: ClassVar[bool] = False
    # FLUX.2 edits from any number of reference images (the pipelines' ``image`` list), none
    # for text to image
    REFERENCE_IMAGES: ClassVar[tuple[int, int | None]] = (0, None)
    MAIN_FILE: ClassVar = SPECS["klein"]  # Black Forest Labs' names (klein's and dev's alike)

    model: str = "klein"
    size: str = "4b"
    distilled: bool = False
    guidance_scale: float = 4.0  # dev's distilled guidance input

    def describe(self) -> str:
        if self.model == "dev":
            return f"FLUX.2 [dev] (guidance {self.guidance_scale:g})"
        kind = "distilled" if self.distilled else "base"
        text = f"FLUX.2 [klein] {self.size.upper()} {kind}"
        return text + (f"; {DISTILLED_NOTE}" if self.distilled and self.model == "klein" else "")

    # -- conditioning ------------------------------------------------------------------------

    def encode_text(
        self, tokenizers, text_encoders, captions, device, clip_skip=None, max_token_length=None
    ) -> TextConditioning:
        (tokenizer,), (encoder,) = tokenizers, text_encoders
        if self.model == "dev":  # Mistral 3, FLUX.2's system message first
            from diffusers.pipelines.flux2.system_messages import SYSTEM_MESSAGE

            ids, mask = mistral3.tokenize(tokenizer, list(captions), MAX_TOKENS, SYSTEM_MESSAGE)
        else:  # Qwen3, thinking off
            ids, mask = qwen3.tokenize(tokenizer, list(captions), MAX_TOKENS, thinking=False)
        return TextConditioning(
            hidden_states.layer_states(encoder, ids, mask, TEXT_LAYERS[self.model]), None, None
        )

    def assemble_conditioning(self, text, batch, device, dtype=None) -> Conditioning:
        references = reference_latents(batch, device, dtype)
        hidden = text.hidden.to(device) if dtype is None else text.hidden.to(device, dtype)
        return Conditioning(hidden, {REFERENCES: references} if references else {})

    def predict(self, denoiser, noisy, timesteps, cond) -> torch.Tensor:
        """The velocity [B, 128, h, w] of noisy latents at sigma ``timesteps``."""
        b, c, h, w = noisy.shape
        text = cond.encoder_hidden_states
        guidance = None
        if self.model == "dev":
            guidance = torch.full((b,), self.guidance_scale, device=noisy.device, dtype=noisy.dtype)
        tokens, ids = [noisy.flatten(2).transpose(1, 2)], [lattice_ids(0, h, w, 1, b, noisy.device)]
        for k, ref in enumerate(cond.unet_kwargs.get(REFERENCES, ())):  # _prepare_image_ids
            tokens.append(ref.to(noisy.dtype).flatten(2).transpose(1, 2))
            ids.append(lattice_ids(REFERENCE_T_STEP * (k + 1), *ref.shape[-2:], 1, b, noisy.device))
        out = denoiser(
            hidden_states=torch.cat(tokens, dim=1),
            encoder_hidden_states=text,
            timestep=timesteps.to(noisy.dtype),
            img_ids=torch.cat(ids, dim=1),
            txt_ids=lattice_ids(0, 1, 1, text.shape[1], b, noisy.device),
            guidance=guidance,
            return_dict=False,
        )[0]
        return out[:, : h * w].transpose(1, 2).reshape(b, c, h, w)

    def latent_codec(self, vae):
        return BatchNormPatchedCodec(vae)

    # -- adapters ----------------------------------------------------------------------------

    def file_modules(self, transformer):
        """Every Linear of the original model (names.py), in its order: the top-level ones,
        then the blocks' (musubi-tuner's default adapters: ``transformer_modules``)."""
        top = top_modules(transformer, self.unet_lora_prefix.rstrip("_"), TABLE)
        return top + self.transformer_modules(transformer)

    # -- sizes, options, files ---------------------------------------------------------------

    def swap_blocks(self, transformer, count):
        """The last ``count`` single blocks (most of the model), then double blocks."""
        single = min(count, len(transformer.single_transformer_blocks))
        return swappable_tails(
            ("double", transformer.transformer_blocks, count - single),
            ("single", transformer.single_transformer_blocks, single),
            count=count,
        )

    def metadata_keys(self, config):
        keys = DRAW.metadata(config.flow)
        return {**keys, "ss_guidance_scale": self.guidance_scale} if self.model == "dev" else keys

    def check_options(self, model, flow):
        super().check_options(model, flow)
        if flow.guidance_scale is not None and self.model != "dev":
            raise ConfigError("guidance_scale: FLUX.2 [klein] has no guidance input; remove it")

    def sampling_pipeline(self):
        return flux2_pipeline_kind(self.model, self.distilled)

    def write_full_model(self, path, denoiser, components, metadata, dtype):
        """As flux-2-klein-base-4b.safetensors, with whether it is distilled in the header."""
        header = {DISTILLED_KEY: str(self.distilled).lower(), **dict(metadata or {})}
        super().write_full_model(path, denoiser, components, header, dtype)


def flux2_family(model: str, size: str, distilled: bool, flow=None) -> Flux2Family:
    """The FLUX.2 family of a loaded model (``flow``: the [flow] section, for dev's guidance)."""
    if distilled and model == "klein":
        log.warning("FLUX.2 [klein] %s is %s", size.upper(), DISTILLED_NOTE)
    guidance = getattr(flow, "guidance_scale", None)
    return Flux2Family(
        name=f"flux2-{model}-{size}" + ("" if model == "dev" else ("" if distilled else "-base")),
        base_model_version=f"flux2_{model}",  # as other tools write it
        modelspec_architecture=f"Flux.2-{model}",  # musubi-tuner's ARCH_FLUX_2 for dev,
        default_resolution=1024,
        lora_implementation="https://github.com/black-forest-labs/flux2",
        checkpoint_implementation="https://github.com/black-forest-labs/flux2",
        latent_scale=1.0,
        network_modules=("lycoris.kohya", "networks.lora", "networks.lora_flux_2"),
        model=model,
        size=size,
        distilled=distilled,
        guidance_scale=4.0 if guidance is None else float(guidance),
    )


# A Flux2KleinPipeline or Flux2Pipeline folder, or a FLUX.2 transformer file (damaged ones by
# their header text); ModelError for a folder of another FLUX.2 pipeline.
claims_flux2 = claimer(*SPECS.values())


def load_flux2(
    model: ModelSection, flow: FlowSection, weight_dtype: torch.dtype, vae_dtype: torch.dtype
) -> Components:
    """FLUX.2's Components (frozen, on the CPU) from a klein or dev folder or a transformer file,
    by its pipeline's spec (spec.py); ModelError for any problem with the files."""
    spec = spec_for(tuple(SPECS.values()), model)  # dev's file by its guidance input
    loaded = load_spec(spec, model, flow, weight_dtype, vae_dtype)
    name, size = model_of(dict(loaded.modules["transformer"].config))
    scheduler = folder_scheduler(loaded.model_dir, SCHEDULER_CONFIG)
    # one token per latent pixel: the codec patchifies
    objective = Flux2FlowObjective(DRAW.options(flow), scheduler, patch=1)
    return components(spec, loaded, objective, flux2_family(name, size, loaded.facts, flow))
