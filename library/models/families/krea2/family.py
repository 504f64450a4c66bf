"""Krea 2 as a ModelFamily (facts: spec.py, diffusers' Krea2Pipeline): latents are the
Qwen-Image VAE's one-frame clips normalised per channel; captions are Qwen3-VL's tapped layers
[B, L, taps, width] at each caption's own length, handed to the transformer with their mask,
the 2x2 patch tokens and the (t, h, w) positions of both; only the transformer trains (as
musubi-tuner: no Qwen3-VL adapters); a full fine-tune is the transformer in the original names,
as Krea and ComfyUI distribute raw.safetensors.

Samples through diffusers' Krea2Pipeline fed our conditioning: Euler over the folder's
scheduler (resolution-aware shift; Turbo, the pipeline's ``is_distilled``: mu = 1.15). Its
guidance is cond + g (cond - uncond), on when g > 0: the usual CFG at scale 1 + g, so a prompt's
``scale`` s (musubi-tuner's ``--l``) is g = s - 1; unset, 5.5 (the pipeline's 4.5) for RAW, 1
(none) for Turbo. Sides are rounded down to multiples of 16."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import ClassVar

import torch

from library.models import caption_lengths
from library.models.conditioning import Conditioning, TextConditioning
from library.models.families import denoiser_adapters as adapters
from library.models.families.base import ModelFamily
from library.models.families.flow_options import check_flow_model_options
from library.models.families.krea2 import spec
from library.models.families.krea2.keys import TABLE
from library.models.families.sampling_weights import (
    check_swap_options,
    swapped_base_weights,
    weights_files,
)
from library.models.families.spec_loader import write_main_file
from library.models.families.transformer_family import swappable_tails
from library.models.patch_tokens import grid_positions, pack, unpack
from library.models.text_encoders.qwen3_vl import unused_layers
from library.models.video_latent_codec import ChannelNormalizedVideoCodec
from library.networks.fused_keys import linears_inside
from library.networks.key_maps import AliasedPathNames
from library.networks.kohya_names import unwrap
from library.networks.path_names import PREFIX, path_names
from library.sampling.pipelines import PipelineKind, on_grid, refuse_uncarried

LENGTHS = caption_lengths.LENGTHS
TURBO_KEY = "turbo_dit"  # [flow]: samples drawn on Turbo's weights (musubi-tuner's --turbo_dit)
TURBO = "the Turbo transformer (turbo.safetensors, or a Krea-2-Turbo diffusers folder)"


def krea2_pipeline_kind(taps: tuple[int, ...], distilled: bool) -> PipelineKind:
    """diffusers' Krea2Pipeline fed our conditioning (module docstring)."""
    return PipelineKind(
        "Krea2Pipeline",
        options={"text_encoder_select_layers": taps, "is_distilled": distilled},
        denoiser_argument="transformer",
        call_inputs=krea2_pipeline_inputs,
        prompt_defaults={"sampler": "euler", "scale": 1.0 if distilled else 5.5},
    )


def krea2_pipeline_inputs(cond, prompt) -> dict:
    """Call keywords from the conditioning of [prompt, negative prompt]: both at one width
    (the pipeline gives them the same positions), each with the mask of its own length."""
    refuse_uncarried(cond, (LENGTHS,), "Krea2Pipeline")
    hidden = cond.encoder_hidden_states
    masks = torch.arange(hidden.shape[1])[None, :] < cond.unet_kwargs[LENGTHS].reshape(-1, 1)
    masks = masks.to(hidden.device)
    guidance = max(float(prompt.scale) - 1.0, 0.0)
    inputs = {
        "prompt_embeds": hidden[:1],
        "prompt_embeds_mask": masks[:1],
        "guidance_scale": guidance,
        "width": on_grid(prompt.width, spec.PIXEL_MULTIPLE),
        "height": on_grid(prompt.height, spec.PIXEL_MULTIPLE),
    }
    if guidance > 0:
        inputs |= {"negative_prompt_embeds": hidden[1:2], "negative_prompt_embeds_mask": masks[1:2]}
    return inputs


PROJECTOR = "text_fusion.projector"  # 12 weights: an adapter of any rank would outweigh it
# Adapter files: the original names written (keys.py), every other tool's read
NAMES = path_names(
    "Krea 2", "transformer_blocks.0.attn.to_q", TABLE, ("base_model.model.",), writes_original=True
)


def linear_targets(module, every: bool) -> dict:
    """The transformer's Linears but the text projector: all, or (``every`` false) those of
    the attention and feed-forward modules."""
    paths = linears_inside(unwrap(module))
    chosen = (p for p in paths if every or ".attn." in p or ".ff." in p)
    return {p: "linear" for p in chosen if p != PROJECTOR}


@dataclass(frozen=True, kw_only=True)
class Krea2Family(ModelFamily):
    """Krea 2 with its text taps and whether the loaded transformer is the distilled Turbo."""

    PIXEL_MULTIPLE: ClassVar[int] = spec.PIXEL_MULTIPLE
    LABEL: ClassVar[str] = "Krea 2"
    DENOISER_ONLY_ADAPTERS: ClassVar[str | None] = "no Qwen3-VL adapters, as musubi-tuner"

    taps: tuple[int, ...] = spec.TAPS
    caption_tokens: int = spec.MAX_TOKENS
    distilled: bool = False  # the pipeline's is_distilled (Turbo)
    turbo: str | None = None  # [flow] turbo_dit: samples drawn on Turbo's weights

    def describe(self) -> str:
        kind = "Turbo (distilled)" if self.distilled else "RAW"
        return f"Krea 2 {kind} ({len(self.taps)} Qwen3-VL layers, {self.caption_tokens} tokens)"

    @property
    def text_cache_name(self) -> str:
        return f"{self.name}|qwen3vl_taps={','.join(map(str, self.taps))}|{self.caption_tokens}"

    def encode_text(
        self, tokenizers, text_encoders, captions, device, clip_skip=None, max_token_length=None
    ) -> TextConditioning:
        """Each caption's tapped states, the batch padded to its longest, with the lengths."""
        (tokenizer,), (encoder,) = tokenizers, text_encoders
        taps = spec.text_taps(self.taps, self.caption_tokens)
        states, lengths = taps.encode(tokenizer, encoder, list(captions), device)
        return TextConditioning(states, None, None, lengths=lengths)

    def assemble_conditioning(self, text, batch, device, dtype=None) -> Conditioning:
        return caption_lengths.conditioning(text, device, dtype)

    def predict(self, denoiser, noisy, timesteps, cond) -> torch.Tensor:
        """The velocity [B, C, 1, h, w] of one-frame latents at sigma ``timesteps``."""
        lengths = cond.unet_kwargs[LENGTHS]
        width, (h, w) = int(lengths.max()), noisy.shape[-2:]
        mask = torch.arange(width)[None, :] < lengths.reshape(-1, 1)
        positions = grid_positions(width, h // spec.PATCH, w // spec.PATCH)
        out = denoiser(
            hidden_states=pack(noisy, spec.PATCH),
            encoder_hidden_states=cond.encoder_hidden_states[:, :width],
            timestep=timesteps,
            position_ids=positions.to(noisy.device),
            encoder_attention_mask=mask.to(noisy.device),
            return_dict=False,
        )[0]
        return unpack(out, h, w, spec.PATCH)

    def latent_codec(self, vae):
        return ChannelNormalizedVideoCodec(vae)

    def unused_text_layers(self, index, num_layers, clip_skip=None):
        return unused_layers(self.taps, num_layers)

    def adapter_targets(self, module, role, conv):
        """Every Linear of the transformer but the text projector (musubi-tuner's set)."""
        adapters.transformer_only(role, self.LABEL)
        return linear_targets(module, every=True)

    def lycoris_targets(self, module, role, preset):
        """Every Linear but the projector, or the attention and feed-forward ones (attention
        alone for attn-only)."""
        return adapters.preset_targets(
            self.LABEL, role, preset, lambda every: linear_targets(module, every), ".attn."
        )

    def adapter_key_map(self):
        """Written in the original names, alpha folded (keys.py); read under every name."""
        return AliasedPathNames(prefix=PREFIX, names=NAMES, folds_alpha=True)

    def swap_blocks(self, denoiser, count):
        return swappable_tails(("single", denoiser.transformer_blocks, count), count=count)

    def metadata_keys(self, config):
        """The run's flow-matching draw, in kohya's ss_* names."""
        return spec.DRAW.metadata(config.flow)

    def check_options(self, model, flow):
        check_flow_model_options(model, flow, "krea2", self.LABEL, False)

    def check_training(self, config):
        super().check_training(config)
        adapters.check_lora(config, self.LABEL)
        if getattr(config.flow, "turbo_dit", None):
            check_swap_options(
                config, TURBO_KEY, "Turbo's weights", "samples are then drawn on RAW"
            )

    def write_full_model(self, path, denoiser, components, metadata, dtype):
        """The transformer alone in the original names (as raw.safetensors, which ComfyUI and
        diffusers' from_single_file read), its config in the header for exact reloading."""
        write_main_file(spec.SPEC, path, denoiser, metadata, dtype)

    def full_model_modules(self, components):
        return (components.denoiser,)

    def sampling_pipeline(self):
        return krea2_pipeline_kind(self.taps, self.distilled or self.turbo is not None)

    def sampling_weights(self, denoiser):
        """Turbo's base weights for the round when turbo_dit is set (families/sampling_weights.py:
        the LoRA trained on RAW previewed on Turbo, with Turbo's fixed shift and no guidance)."""
        if self.turbo is None:
            return contextlib.nullcontext()
        return swapped_base_weights(denoiser, weights_files(TURBO_KEY, self.turbo, TURBO), TABLE)


def krea2_family(taps=spec.TAPS, distilled: bool = False, turbo=None) -> Krea2Family:
    """The Krea 2 family of a model with these taps (the pipeline's select layers)."""
    return Krea2Family(
        taps=tuple(taps), distilled=distilled, turbo=turbo, name="krea2", prediction_type="flow",
        base_model_version="krea2", modelspec_architecture="Krea-2", default_resolution=1024,
        lora_implementation="https://github.com/krea-ai/krea-2",
        checkpoint_implementation="https://github.com/krea-ai/krea-2",
        denoiser_subfolder="transformer",
        network_modules=("lycoris.kohya", "networks.lora", "networks.lora_krea2"),
    )  # fmt: skip
