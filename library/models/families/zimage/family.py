"""Z-Image (Base and Turbo) as a ModelFamily: what the trainer asks of the model.

The facts are the package's (docs/zimage.md): conditioning.py encodes captions, denoise.py packs
latents for the transformer, objective.py trains it, targets.py chooses the adapted
Linears and key_map.py names them in files. This module joins them behind the family seam:

- captions keep their own lengths (library/models/caption_lengths.py): ``predict`` hands the
  transformer one [L_i, 2560] tensor per image, as ZImagePipeline does;
- only the transformer trains (musubi-tuner's and ai-toolkit's Z-Image LoRAs adapt no Qwen3
  layer), so a LoRA file holds ``diffusion_model.<diffusers path>`` modules alone;
- Base and Turbo differ only in weights and in the sampling shift of their scheduler
  (6.0 / 3.0); the loader tells them apart by the folder's scheduler config (a single
  transformer file: its header, else its name);
- a full fine-tune is written as the transformer alone in the original names (full_file.py),
  and samples are drawn through ZImagePipeline (sampling.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from library.models import caption_lengths
from library.models.conditioning import Conditioning, TextConditioning
from library.models.families import denoiser_adapters as adapters
from library.models.families.base import ModelFamily
from library.models.families.flow_options import check_flow_model_options
from library.models.families.transformer_family import swappable_tails
from library.models.families.zimage import conditioning as captions_
from library.models.families.zimage.denoise import pack, unpack
from library.models.families.zimage.full_file import write_transformer_file
from library.models.families.zimage.key_map import zimage_names
from library.models.families.zimage.objective import DRAW
from library.models.families.zimage.sampling import zimage_pipeline_kind
from library.models.families.zimage.shapes import F_PATCH_SIZE, PATCH_SIZE, SCHEDULER_SHIFT
from library.models.families.zimage.targets import default_targets

FLOW_KIND = "zimage"  # the family's name in the registry


def variant_of_shift(shift: float) -> str:
    """ "turbo" or "base" for a released scheduler shift; "custom" for another."""
    return next((v for v, s in SCHEDULER_SHIFT.items() if s == shift), "custom")


@dataclass(frozen=True, kw_only=True)
class ZImageFamily(ModelFamily):
    """Z-Image with its variant and caption length."""

    PIXEL_MULTIPLE: ClassVar[int] = 16  # the VAE's 8 times the 2x2 patches
    LABEL: ClassVar[str] = "Z-Image"
    DENOISER_ONLY_ADAPTERS: ClassVar[str | None] = (
        "no Qwen3 adapters, as musubi-tuner and ai-toolkit"
    )

    variant: str = "turbo"  # "turbo", "base" or "custom" (by the scheduler's shift)
    sampling_shift: float = SCHEDULER_SHIFT["turbo"]
    caption_tokens: int = captions_.MAX_LENGTH  # Qwen3 tokens per caption (the pipeline's 512)

    def describe(self) -> str:
        return (
            f"Z-Image {self.variant} (sampling shift {self.sampling_shift:g}, "
            f"{self.caption_tokens} Qwen3 tokens)"
        )

    @property
    def text_cache_name(self) -> str:
        return f"{self.name}|qwen3_tokens={self.caption_tokens}"

    # -- conditioning ------------------------------------------------------------------------

    def encode_text(
        self, tokenizers, text_encoders, captions, device, clip_skip=None, max_token_length=None
    ) -> TextConditioning:
        """Qwen3's next-to-last hidden states of the chat-formatted captions (conditioning.py),
        run as the pipeline runs them (padded to 512 tokens, padding masked), given as the
        batch cut to its longest caption, padding zeroed, with each caption's length."""
        (tokenizer,), (encoder,) = tokenizers, text_encoders
        return captions_.encode(tokenizer, encoder, list(captions), self.caption_tokens)

    def assemble_conditioning(self, text, batch, device, dtype=None) -> Conditioning:
        return caption_lengths.conditioning(text, device, dtype)

    def predict(self, denoiser, noisy, timesteps, cond) -> torch.Tensor:
        """The transformer's raw output [B, C, h, w] (x0 - noise at its best): one one-frame
        latent and one caption of its own length per image; ``timesteps`` is 1 - sigma."""
        outputs = denoiser(
            pack(noisy),
            timesteps,
            caption_lengths.rows(cond),
            patch_size=PATCH_SIZE,
            f_patch_size=F_PATCH_SIZE,
            return_dict=False,
        )[0]
        return unpack(outputs)

    # -- adapters ----------------------------------------------------------------------------

    def adapter_targets(self, module, role, conv):
        """musubi-tuner's Linears of the transformer (targets.py)."""
        adapters.transformer_only(role, self.LABEL)
        return default_targets(module)

    def lycoris_targets(self, module, role, preset):
        """The joint blocks' attention and feed-forward Linears for attn-mlp and attn-only
        (attention alone there), with the blocks' modulation and the refiner blocks for the
        presets that adapt every layer (full, full-lin, unet-only)."""
        return adapters.preset_targets(
            self.LABEL, role, preset,
            lambda every: default_targets(module, modulation=every, refiners=every),
            ".attention.",
        )  # fmt: skip

    def adapter_key_map(self):
        """The transformer's adapted Linears as ``diffusion_model.<diffusers path>`` modules,
        read under every name other tools give them (key_map.py)."""

        return zimage_names()

    # -- sizes, options ----------------------------------------------------------------------

    def swap_blocks(self, denoiser, count):
        """The last ``count`` joint blocks (the refiners are small and stay)."""

        return swappable_tails(("joint", denoiser.layers, count), count=count)

    def metadata_keys(self, config):
        """The run's flow-matching draw, in kohya's ss_* names."""

        return DRAW.metadata(config.flow)

    def check_options(self, model, flow):
        """Other families' [flow] keys and SD 2.x's v2 are refused; SD text settings at other
        values than the GUIs' get a warning (Z-Image reads none of them)."""
        check_flow_model_options(model, flow, FLOW_KIND, "Z-Image", False)

    def check_training(self, config):
        """A LoRA or LyCORIS of the transformer (no text-encoder adapters, no conv rank), or a
        full fine-tune of the transformer (train_mode = "unet")."""
        super().check_training(config)
        adapters.check_lora(config, self.LABEL)  # Qwen3 stays frozen (setup_training)

    # -- full fine-tunes, sampling ------------------------------------------------------------

    def write_full_model(self, path, denoiser, components, metadata, dtype):
        """The trained transformer alone in the original names (keys.py), as Comfy-Org's
        z_image_turbo_bf16.safetensors is distributed (ComfyUI's diffusion_models/; difftune
        reads it back as pretrained_model_name_or_path), with its diffusers config and the
        sampling scheduler's in the header (difftune.config.transformer / .scheduler) for exact
        reloading; Qwen3 and the AE stay the user's files."""

        write_transformer_file(path, denoiser, self.sampling_shift, metadata, dtype)

    def full_model_modules(self, components):
        return (components.denoiser,)

    def sampling_pipeline(self):
        """ZImagePipeline fed our conditioning (sampling.py): Turbo without guidance, Base with
        it."""

        return zimage_pipeline_kind(self.variant)


def zimage_family(variant: str, sampling_shift: float) -> ZImageFamily:
    """The Z-Image family of a model whose scheduler samples with ``sampling_shift``."""
    return ZImageFamily(
        name=f"zimage-{variant}",
        prediction_type="flow",
        base_model_version="z_image",  # musubi-tuner's ss_base_model_version
        modelspec_architecture="Z-Image",  # musubi-tuner's ARCH_Z_IMAGE; LoRAs: "Z-Image/lora"
        default_resolution=1024,
        text_encoder_subfolders=("text_encoder",),
        tokenizer_subfolders=("tokenizer",),
        text_encoder_lora_prefixes=("lora_te",),
        lora_implementation="https://github.com/Tongyi-MAI/Z-Image",
        checkpoint_implementation="https://github.com/Tongyi-MAI/Z-Image",
        denoiser_subfolder="transformer",
        latent_scale=0.3611,
        network_modules=("lycoris.kohya", "networks.lora", "networks.lora_zimage"),
        variant=variant,
        sampling_shift=float(sampling_shift),
    )
