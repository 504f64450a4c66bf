"""Qwen-Image (text to image) as a ModelFamily: what the trainer asks of the model.

The facts are the package's (docs/qwenimage.md): conditioning.py encodes captions, denoise.py
packs latents for the transformer, objective.py trains it, targets.py chooses the adapted
Linears and key_map.py names them in files. This module joins them behind the family seam:

- latents are the video VAE's one-frame clips [B, 16, 1, h, w], normalised per channel by the
  VAE config's latents_mean / latents_std (ChannelNormalizedVideoCodec);
- captions keep their own lengths (library/models/caption_lengths.py): ``predict`` hands the
  transformer the mask of those lengths (none when all are equal, as the pipeline);
- only the transformer trains (musubi-tuner's Qwen-Image LoRAs adapt no Qwen2.5-VL layer), so a
  LoRA file holds ``diffusion_model.<diffusers path>`` modules alone, and a full fine-tune is
  the transformer alone in diffusers' names (spec.py's main file), as ComfyUI loads it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from library.errors import ConfigError
from library.models import caption_lengths
from library.models.conditioning import Conditioning, TextConditioning
from library.models.families import denoiser_adapters as adapters
from library.models.families.base import (
    REFERENCE_LATENTS_KEY,
    REFERENCE_PIXELS_KEY,
    ModelFamily,
    reference_latents,
)
from library.models.families.flow_options import check_flow_model_options
from library.models.families.qwenimage import conditioning as captions_
from library.models.families.qwenimage.denoise import img_shapes, pack, unpack
from library.models.families.qwenimage.key_map import qwenimage_names
from library.models.families.qwenimage.objective import DRAW
from library.models.families.qwenimage.sampling import qwenimage_pipeline_kind
from library.models.families.qwenimage.shapes import PIXEL_MULTIPLE
from library.models.families.qwenimage.spec import SPEC
from library.models.families.qwenimage.targets import default_targets
from library.models.families.spec_loader import write_main_file
from library.models.families.transformer_family import swappable_tails
from library.models.video_latent_codec import ChannelNormalizedVideoCodec

FLOW_KIND = "qwenimage"  # the family's name in the registry


@dataclass(frozen=True, kw_only=True)
class QwenImageFamily(ModelFamily):
    """Qwen-Image with its caption length."""

    PIXEL_MULTIPLE: ClassVar[int] = PIXEL_MULTIPLE  # the VAE's 8 times the 2x2 patches
    LABEL: ClassVar[str] = "Qwen-Image"
    DENOISER_ONLY_ADAPTERS: ClassVar[str | None] = "no Qwen2.5-VL adapters, as musubi-tuner"

    caption_tokens: int = captions_.MAX_LENGTH  # Qwen2.5-VL tokens per caption (the pipeline's)
    # a LoRA adapts the blocks' img_mod / txt_mod too ([flow] exclude_mod = false)
    adapt_modulation: bool = False

    def describe(self) -> str:
        return self.edited(f"Qwen-Image ({self.caption_tokens} Qwen2.5-VL tokens)")

    @property
    def text_cache_name(self) -> str:
        return f"{self.name}|qwen25vl_tokens={self.caption_tokens}"

    # -- conditioning ------------------------------------------------------------------------

    def encode_text(
        self, tokenizers, text_encoders, captions, device, clip_skip=None, max_token_length=None
    ) -> TextConditioning:
        """Qwen2.5-VL's last hidden states of the templated captions without the template's
        first 34 tokens (conditioning.py), as the batch padded to its longest caption (padding
        zeroed) with each caption's length. An edit variant's captions alone (only the memory
        estimate asks, for shapes): its second tokenizer is its processor."""
        (encoder,) = text_encoders
        return captions_.encode(tokenizers[0], encoder, list(captions), self.caption_tokens)

    def assemble_conditioning(self, text, batch, device, dtype=None) -> Conditioning:
        """The captions' states and lengths, with an edit variant's batch's reference latents
        and pixels (which its sampling pipeline takes as the image)."""
        cond = caption_lengths.conditioning(text, device, dtype)
        batch = batch or {}
        if batch.get(REFERENCE_LATENTS_KEY):
            cond.unet_kwargs[REFERENCE_LATENTS_KEY] = reference_latents(batch, device, dtype)
        if batch.get(REFERENCE_PIXELS_KEY):
            cond.unet_kwargs[REFERENCE_PIXELS_KEY] = list(batch[REFERENCE_PIXELS_KEY])
        return cond

    def context_latents(self, cond) -> list[torch.Tensor]:
        """One-frame latents [B, C, 1, h_k, w_k] the transformer reads after the noisy image's,
        whose outputs are not predictions: none for text to image, an edit variant's reference
        images (its ``context`` hook, called with the family and ``cond``) for an edit."""
        hooks = self.edit_hooks
        return hooks.context(self, cond) if hooks else []

    def predict(self, denoiser, noisy, timesteps, cond) -> torch.Tensor:
        """The transformer's velocity [B, C, 1, h, w] (noise - x0 at its best) for one-frame
        latents; ``timesteps`` is sigma. Context latents (``context_latents``) are packed after
        the image's tokens, each with its own frame grid in img_shapes."""
        lengths = cond.unet_kwargs[caption_lengths.LENGTHS]
        hidden = cond.encoder_hidden_states[:, : int(lengths.max())]
        mask = caption_lengths.mask(lengths, hidden.shape[1])
        h, w = noisy.shape[-2:]
        tokens = pack(noisy)
        image_tokens = tokens.shape[1]
        (shapes,) = img_shapes(1, h, w)
        for latents in self.context_latents(cond):
            tokens = torch.cat([tokens, pack(latents.to(tokens.dtype))], dim=1)
            shapes = shapes + img_shapes(1, *latents.shape[-2:])[0]
        out = denoiser(
            hidden_states=tokens,
            encoder_hidden_states=hidden,
            encoder_hidden_states_mask=None if mask is None else mask.to(hidden.device),
            timestep=timesteps,
            img_shapes=[shapes] * noisy.shape[0],
            return_dict=False,
        )[0]
        return unpack(out[:, :image_tokens], h, w)

    def latent_codec(self, vae):
        """The video VAE's one-frame latents, normalised per channel (latents_mean / std)."""
        return ChannelNormalizedVideoCodec(vae)

    # -- adapters ----------------------------------------------------------------------------

    def adapter_targets(self, module, role, conv):
        """musubi-tuner's Linears of the transformer (targets.py), with the modulation when
        exclude_mod is false."""
        adapters.transformer_only(role, self.label)
        return default_targets(module, modulation=self.adapt_modulation)

    def lycoris_targets(self, module, role, preset):
        """The blocks' attention and feed-forward Linears (attention alone for attn-only), with
        the blocks' modulation for the presets that adapt every layer."""
        return adapters.preset_targets(
            self.label, role, preset,
            lambda every: default_targets(module, modulation=every),
            ".attn.",
        )  # fmt: skip

    def adapter_key_map(self):
        """The transformer's adapted Linears as ``diffusion_model.<diffusers path>`` modules."""
        return qwenimage_names()

    # -- sizes, options ----------------------------------------------------------------------

    def swap_blocks(self, denoiser, count):
        """The last ``count`` dual-stream blocks."""
        return swappable_tails(("dual", denoiser.transformer_blocks, count), count=count)

    def metadata_keys(self, config):
        """The run's flow-matching draw, in kohya's ss_* names."""
        return DRAW.metadata(config.flow)

    def check_options(self, model, flow):
        """Other families' [flow] keys and SD 2.x's v2 are refused."""
        check_flow_model_options(model, flow, FLOW_KIND, "Qwen-Image", False)

    def check_training(self, config):
        """A LoRA or LyCORIS of the transformer (no text-encoder adapters, no conv rank), or a
        full fine-tune of the transformer (train_mode = "unet"; Qwen2.5-VL stays frozen)."""
        super().check_training(config)
        adapters.check_lora(config, self.label)
        lycoris = config.network.network_module == "lycoris.kohya"
        if (
            config.network.train_mode == "lora"
            and lycoris
            and getattr(config.flow, "exclude_mod", None) is not None
        ):
            raise ConfigError(
                "exclude_mod chooses the layers of a LoRA; with lycoris.kohya the preset does "
                "(full and full-lin adapt the modulation, attn-mlp leaves it out): remove it"
            )

    # -- full fine-tunes, sampling ------------------------------------------------------------

    def write_full_model(self, path, denoiser, components, metadata, dtype):
        """The trained transformer alone in diffusers' names, as Comfy-Org's
        qwen_image_bf16.safetensors (ComfyUI's diffusion_models/; difftune reads it back as
        pretrained_model_name_or_path), its config in the header (difftune.config.transformer)
        for exact reloading; Qwen2.5-VL and the VAE stay the user's files."""
        write_main_file(SPEC, path, denoiser, metadata, dtype)

    def full_model_modules(self, components):
        return (components.denoiser,)

    def sampling_pipeline(self):
        """QwenImagePipeline fed our conditioning (sampling.py); an edit variant's pipeline (its
        hook)."""
        hooks = self.edit_hooks
        return hooks.sampling_pipeline(self) if hooks else qwenimage_pipeline_kind()


def qwenimage_family(flow=None) -> QwenImageFamily:
    """The Qwen-Image family, with the [flow] section's exclude_mod (unset: musubi-tuner's
    default, the modulation left out)."""
    return QwenImageFamily(
        adapt_modulation=getattr(flow, "exclude_mod", None) is False,
        name="qwenimage",
        prediction_type="flow",
        base_model_version="qwen_image",  # musubi-tuner's ss_base_model_version
        modelspec_architecture="Qwen-Image",  # musubi-tuner's; LoRAs: "Qwen-Image/lora"
        default_resolution=1024,
        text_encoder_subfolders=("text_encoder",),
        tokenizer_subfolders=("tokenizer",),
        text_encoder_lora_prefixes=("lora_te",),
        lora_implementation="https://github.com/QwenLM/Qwen-Image",
        checkpoint_implementation="https://github.com/QwenLM/Qwen-Image",
        denoiser_subfolder="transformer",
        network_modules=("lycoris.kohya", "networks.lora", "networks.lora_qwen_image"),
    )
