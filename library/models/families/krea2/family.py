"""Krea 2 (text to image) as a ModelFamily: what the trainer asks of the model.

The facts are the package's (spec.py, docs/krea2.md), from diffusers' Krea2Pipeline:

- latents are the Qwen-Image VAE's one-frame clips [B, 16, 1, h, w], normalised per channel by
  the VAE config's latents_mean / latents_std (ChannelNormalizedVideoCodec);
- captions are Qwen3-VL's hidden states of twelve layers kept as their own axis
  [B, L, 12, 2560] (text_encoders/qwen3_vl.py), each caption at its own length; ``predict``
  hands the transformer the mask of those lengths, the patch tokens and the (t, h, w) positions
  of the caption (all at the origin) and the image's patches (models/patch_tokens.py);
- only the transformer trains (musubi-tuner's Krea 2 LoRAs adapt every Linear of the
  transformer, no Qwen3-VL layer); a LoRA file is written as key_map.py says, and a full
  fine-tune is the transformer alone in the original names (full_file.py), as Krea and ComfyUI
  distribute raw.safetensors.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from library.errors import ConfigError
from library.models.conditioning import Conditioning, TextConditioning
from library.models.families.base import ModelFamily
from library.models.families.flow_options import check_flow_model_options
from library.models.families.krea2 import spec
from library.models.families.krea2.full_file import write_transformer_file
from library.models.families.krea2.key_map import krea2_names
from library.models.families.krea2.objective import krea2_flow_options
from library.models.families.krea2.sampling import LENGTHS, krea2_pipeline_kind
from library.models.families.transformer_family import swappable_tails
from library.models.patch_tokens import grid_positions, pack, unpack
from library.models.text_encoders.qwen3_vl import unused_layers
from library.models.video_latent_codec import ChannelNormalizedVideoCodec
from library.networks.fused_keys import linears_inside
from library.networks.kohya_names import unwrap

FLOW_KIND = "krea2"  # the family's name in the registry
PROJECTOR = "text_fusion.projector"  # a 12-to-1 Linear
# LyCORIS preset -> the Linears it adapts (a path test); musubi-tuner's default is every Linear
_LYCORIS_PRESETS = {
    "full": lambda path: True,
    "full-lin": lambda path: True,
    "unet-only": lambda path: True,
    "attn-mlp": lambda path: ".attn." in path or ".ff." in path,
    "unet-transformer-only": lambda path: ".attn." in path or ".ff." in path,
    "attn-only": lambda path: ".attn." in path,
}


@dataclass(frozen=True, kw_only=True)
class Krea2Family(ModelFamily):
    """Krea 2 with its text taps and whether the loaded transformer is the distilled Turbo."""

    PIXEL_MULTIPLE: ClassVar[int] = spec.PIXEL_MULTIPLE
    LABEL: ClassVar[str] = "Krea 2"
    DENOISER_ONLY_ADAPTERS: ClassVar[str | None] = "no Qwen3-VL adapters, as musubi-tuner"

    taps: tuple[int, ...] = spec.TAPS
    caption_tokens: int = spec.MAX_TOKENS
    distilled: bool = False  # the Turbo checkpoint (the pipeline's is_distilled)

    def describe(self) -> str:
        kind = "Turbo (distilled)" if self.distilled else "RAW"
        return f"Krea 2 {kind} ({len(self.taps)} Qwen3-VL layers, {self.caption_tokens} tokens)"

    @property
    def text_cache_name(self) -> str:
        taps = ",".join(map(str, self.taps))
        return f"{self.name}|qwen3vl_taps={taps}|tokens={self.caption_tokens}"

    # -- conditioning ------------------------------------------------------------------------

    def encode_text(
        self, tokenizers, text_encoders, captions, device, clip_skip=None, max_token_length=None
    ) -> TextConditioning:
        """Qwen3-VL's tapped states of each templated caption's real tokens, the batch padded
        to its longest caption, with each caption's length."""
        (tokenizer,), (encoder,) = tokenizers, text_encoders
        taps = spec.text_taps(self.taps, self.caption_tokens)
        states, lengths = taps.encode(tokenizer, encoder, list(captions), device)
        return TextConditioning(states, None, None, lengths=lengths)

    def assemble_conditioning(self, text, batch, device, dtype=None) -> Conditioning:
        hidden = text.hidden.to(device)
        if dtype is not None:
            hidden = hidden.to(dtype)
        lengths = text.lengths
        if lengths is None:  # every row whole (a text cache batch of equal lengths)
            lengths = torch.full((hidden.shape[0],), hidden.shape[1], dtype=torch.long)
        return Conditioning(hidden, {LENGTHS: lengths.cpu()})

    def predict(self, denoiser, noisy, timesteps, cond) -> torch.Tensor:
        """The transformer's velocity [B, C, 1, h, w] for one-frame latents at sigma
        ``timesteps``: the captions' states with their mask, the 2x2 patch tokens, the
        positions of both."""
        lengths = cond.unet_kwargs[LENGTHS]
        width = int(lengths.max())
        hidden = cond.encoder_hidden_states[:, :width]
        mask = torch.arange(width)[None, :] < lengths.reshape(-1, 1)
        h, w = noisy.shape[-2:]
        positions = grid_positions(width, h // spec.PATCH, w // spec.PATCH)
        out = denoiser(
            hidden_states=pack(noisy, spec.PATCH),
            encoder_hidden_states=hidden,
            timestep=timesteps,
            position_ids=positions.to(noisy.device),
            encoder_attention_mask=mask.to(noisy.device),
            return_dict=False,
        )[0]
        return unpack(out, h, w, spec.PATCH)

    def latent_codec(self, vae):
        """The Qwen-Image VAE's one-frame latents, normalised per channel."""
        return ChannelNormalizedVideoCodec(vae)

    def unused_text_layers(self, index, num_layers, clip_skip=None):
        """Qwen3-VL's layers past the deepest tap."""
        return unused_layers(self.taps, num_layers)

    # -- adapters ----------------------------------------------------------------------------

    def trains_text_encoder(self, index: int) -> bool:
        return False  # DENOISER_ONLY_ADAPTERS: the run trains the transformer alone

    def adapter_targets(self, module, role, conv):
        """Every Linear of the transformer, as musubi-tuner's networks.lora_krea2, but the text
        fusion's projector (12 weights: an adapter of any rank would outweigh it)."""
        if role != "unet":
            raise ConfigError("Krea 2 LoRAs adapt the transformer only")
        return {p: "linear" for p in linears_inside(unwrap(module)) if p != PROJECTOR}

    def lycoris_targets(self, module, role, preset):
        """Every Linear (full, full-lin), the blocks' attention and feed-forward (attn-mlp) or
        their attention alone (attn-only)."""
        if role != "unet" or preset not in _LYCORIS_PRESETS:
            raise ConfigError(
                f"preset = {preset}: adapts no layer of Krea 2's transformer; use full, "
                "full-lin or attn-mlp"
            )
        chosen = _LYCORIS_PRESETS[preset]
        return {p: "linear" for p in linears_inside(unwrap(module)) if chosen(p) and p != PROJECTOR}

    def adapter_key_map(self):
        """``diffusion_model.<original path>`` with peft tensors, alpha folded (key_map.py)."""
        return krea2_names()

    # -- sizes, options ----------------------------------------------------------------------

    def bucket_grid(self, denoiser) -> int:
        return self.PIXEL_MULTIPLE

    def swap_blocks(self, denoiser, count):
        """The last ``count`` single-stream blocks."""
        return swappable_tails(("single", denoiser.transformer_blocks, count), count=count)

    def metadata_keys(self, config):
        """The run's flow-matching draw, in kohya's ss_* names."""
        o = krea2_flow_options(config.flow)
        return {
            "ss_timestep_sampling": o.timestep_sampling,
            "ss_discrete_flow_shift": o.discrete_flow_shift,
            "ss_weighting_scheme": o.weighting_scheme,
            "ss_sigmoid_scale": o.sigmoid_scale,
        }

    def check_options(self, model, flow):
        """Other families' [flow] keys and SD 2.x's v2 are refused."""
        check_flow_model_options(model, flow, FLOW_KIND, self.LABEL, False)

    def check_training(self, config):
        """A LoRA or LyCORIS of the transformer (no conv rank), or a full fine-tune of it."""
        super().check_training(config)
        net = config.network
        lycoris = net.network_module == "lycoris.kohya"
        if net.train_mode == "lora" and net.conv_dim is not None and not lycoris:
            raise ConfigError("conv_dim: Krea 2's transformer has no convolutions; remove it")

    # -- full fine-tunes, sampling ------------------------------------------------------------

    def write_full_model(self, path, denoiser, components, metadata, dtype):
        """The trained transformer alone in the original names, as Krea's raw.safetensors
        (ComfyUI's diffusion_models/), its config in the header."""
        write_transformer_file(path, denoiser, metadata, dtype)

    def full_model_modules(self, components):
        return (components.denoiser,)

    def sampling_pipeline(self):
        """Krea2Pipeline fed our conditioning (sampling.py), Turbo's schedule for Turbo."""
        return krea2_pipeline_kind(self.taps, self.distilled)


def krea2_family(taps=spec.TAPS, distilled: bool = False) -> Krea2Family:
    """The Krea 2 family for a model with these taps (the pipeline's select layers)."""
    return Krea2Family(
        taps=tuple(taps),
        distilled=distilled,
        name="krea2",
        prediction_type="flow",
        base_model_version="krea2",
        modelspec_architecture="Krea-2",
        default_resolution=1024,
        text_encoder_subfolders=("text_encoder",),
        tokenizer_subfolders=("tokenizer",),
        text_encoder_lora_prefixes=("lora_te",),
        lora_implementation="https://github.com/krea-ai/krea-2",
        checkpoint_implementation="https://github.com/krea-ai/krea-2",
        denoiser_subfolder="transformer",
        network_modules=("lycoris.kohya", "networks.lora", "networks.lora_krea2"),
    )
