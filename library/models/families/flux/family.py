"""Flux.1 (dev and schnell): a rectified-flow transformer conditioned on T5-XXL and CLIP-L.

The facts this implementation relies on (docs/formats.md, Flux.1):

- latents: the AE's 16 channels, ``(sample - 0.1159) * 0.3611`` (from the AE's config), packed
  into tokens of 2x2 patches (64 numbers each); image token (i, j) has position ids (0, i, j),
  text tokens (0, 0, 0);
- text: T5-XXL's last hidden states for the caption padded to 512 tokens (dev) or 256
  (schnell) are the per-token conditioning; CLIP-L's pooled output (77 tokens) is the pooled one;
- timestep: sigma in [0, 1] (diffusers' transformer multiplies by 1000 inside); dev also takes
  the distilled guidance value, schnell has no guidance input;
- LoRA files: kohya's names from the original module tree (library.models.families.flux.lora_keys).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import ClassVar

import torch

from library.errors import ConfigError
from library.models.conditioning import Conditioning, TextConditioning
from library.models.families.base import REFERENCE_LATENTS_KEY, reference_latents
from library.models.families.flux.lora_keys import transformer_modules
from library.models.families.flux.sampling import flux_pipeline_kind
from library.models.families.flux.shapes import (
    CLIP_MAX_LENGTH,
    NUM_DOUBLE_BLOCKS,
    NUM_SINGLE_BLOCKS,
    T5_MAX_LENGTH,
)
from library.models.families.flux.spec import SPEC
from library.models.families.transformer_family import (
    TransformerFamily,
    dual_single_tails,
    flow_metadata,
)
from library.models.patch_tokens import image_position_ids, pack_latents, unpack_latents
from library.models.text_encoders.t5 import t5_states, tokenize_t5
from library.training.objectives import FlowOptions

RELEASED_BLOCKS = (NUM_DOUBLE_BLOCKS, NUM_SINGLE_BLOCKS)


@dataclass(frozen=True, kw_only=True)
class FluxFamily(TransformerFamily):
    """Flux.1 dev or schnell with the run's text and guidance settings."""

    FLOW_KIND: ClassVar[str] = "flux"
    LABEL: ClassVar[str] = "Flux.1"
    MODEL_TYPE: ClassVar[str] = "flux"  # kohya's model_type of these models
    # a full fine-tune: the transformer in Black Forest Labs' layout, as flux1-dev.safetensors
    # is distributed; clip_l, t5xxl and ae stay the user's files
    MAIN_FILE: ClassVar = SPEC

    variant: str = "dev"
    guidance_scale: float = 3.5
    # T5 tokens per caption: kohya's default of the variant unless t5xxl_max_token_length
    t5_max_length: int = 512
    # apply_t5_attn_mask: T5 and the transformer's attention ignore the caption's padding.
    t5_attention_mask: bool = False
    train_blocks: str = "all"  # kohya's train_blocks: "all", "single" or "double"
    # the loaded transformer's (double, single) block counts; None: not known (not loaded)
    blocks: tuple[int, int] | None = None

    def describe(self) -> str:
        guidance = f", guidance {self.guidance_scale:g}" if self.has_guidance else ""
        mask = ", T5 padding masked" if self.t5_attention_mask else ""
        text = f"FLUX.1 {self.variant} ({self.t5_max_length} T5 tokens{mask}{guidance})"
        return self.edited(text + self._blocks_text())

    def _blocks_text(self) -> str:
        """The block counts, and the released ones where they differ: a file without a header
        is sized by its shapes, so a pruned model (Flex.1's 8 double blocks) loads as it is,
        and so would a file cut short by whole blocks."""
        if self.blocks is None:
            return ""
        double, single = self.blocks
        text = f", {double} double + {single} single blocks"
        if self.blocks != RELEASED_BLOCKS:
            text += (
                f" (FLUX.1 releases have {RELEASED_BLOCKS[0]} + {RELEASED_BLOCKS[1]}: a pruned "
                "model, or a file missing blocks: re-download it if it should be whole)"
            )
        return text

    @property
    def text_cache_name(self) -> str:
        mask = "|t5_mask" if self.t5_attention_mask else ""
        return f"{self.name}|t5_tokens={self.t5_max_length}{mask}"

    @property
    def model_type(self) -> str:
        """kohya's model_type of these models (an edit variant's own where it has one)."""
        return (self.edit and self.edit.model_type) or self.MODEL_TYPE

    @property
    def has_guidance(self) -> bool:
        """dev takes the distilled guidance value; schnell has no guidance embedding."""
        return self.variant == "dev"

    # -- conditioning ------------------------------------------------------------------------

    def encode_text(
        self, tokenizers, text_encoders, captions, device, clip_skip=None, max_token_length=None
    ):
        """CLIP-L's pooled output and T5's last hidden states of ``captions``."""
        clip_tokenizer, t5_tokenizer = tokenizers
        clip, t5 = text_encoders
        clip_ids = clip_tokenizer(
            list(captions),
            padding="max_length",
            max_length=CLIP_MAX_LENGTH,
            truncation=True,
            return_tensors="pt",
        ).input_ids.to(device)
        pooled = clip(clip_ids, output_hidden_states=False).pooler_output
        masked = self.t5_attention_mask
        hidden, mask = t5_states(t5_tokenizer, t5, captions, self.t5_max_length, device, masked)
        return TextConditioning(hidden, pooled, mask if masked else None)

    def text_mask(self, tokenizers, captions, device):
        if not self.t5_attention_mask:
            return None
        return tokenize_t5(tokenizers[1], captions, self.t5_max_length).attention_mask.to(device)

    def assemble_conditioning(self, text, batch, device, dtype=None):
        hidden, pooled = text.hidden.to(device), text.pooled.to(device)
        if dtype is not None:
            hidden, pooled = hidden.to(dtype), pooled.to(dtype)
        kwargs = {"pooled_projections": pooled}
        if self.t5_attention_mask:
            if text.mask is None:
                raise ValueError("apply_t5_attn_mask needs the T5 padding mask of the captions")
            kwargs["text_mask"] = text.mask.to(device)
        references = reference_latents(batch, device, dtype)  # an edit variant's (its context)
        if references:
            kwargs[REFERENCE_LATENTS_KEY] = references
        return Conditioning(hidden, kwargs)

    def context_tokens(self, cond, dtype) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """Packed tokens ([B, n, 4C] each) and their position ids ([n, 3] each) the transformer
        reads after the noisy image's, whose outputs are not predictions: none for text to
        image, an edit variant's reference images (its ``context`` hook) for an edit."""
        hooks = self.edit_hooks
        return hooks.context(self, cond, dtype) if hooks else ([], [])

    def predict(self, denoiser, noisy, timesteps, cond):
        batch, channels, height, width = noisy.shape
        tokens = pack_latents(noisy)
        image_tokens = tokens.shape[1]
        img_ids = image_position_ids(height, width, noisy.device, noisy.dtype)
        context, context_ids = self.context_tokens(cond, noisy.dtype)
        if context:
            tokens, img_ids = torch.cat([tokens, *context], 1), torch.cat([img_ids, *context_ids])
        text = cond.encoder_hidden_states
        txt_ids = torch.zeros(text.shape[1], 3, device=noisy.device, dtype=noisy.dtype)
        joint = {}
        text_mask = cond.unet_kwargs.get("text_mask")
        if text_mask is not None:
            # Keys of padded caption tokens are masked in every joint attention; image tokens
            # are always attended to. [B, 1, 1, text + image tokens] broadcasts over heads.
            image = torch.ones(batch, tokens.shape[1], dtype=torch.bool, device=noisy.device)
            keys = torch.cat([text_mask.bool(), image], dim=1)
            joint["attention_mask"] = keys[:, None, None, :]
        guidance = None
        if self.has_guidance:
            guidance = torch.full((batch,), self.guidance_scale, device=noisy.device)
            guidance = guidance.to(noisy.dtype)
        out = denoiser(
            hidden_states=tokens,
            encoder_hidden_states=text,
            pooled_projections=cond.unet_kwargs["pooled_projections"],
            timestep=timesteps.to(noisy.dtype),
            img_ids=img_ids,
            txt_ids=txt_ids,
            guidance=guidance,
            joint_attention_kwargs=joint or None,
            return_dict=False,
        )[0]
        return unpack_latents(out[:, :image_tokens], channels, height, width)

    # -- adapters ----------------------------------------------------------------------------

    def transformer_modules(self, transformer):
        """kohya's modules of the transformer that this run adapts (train_blocks)."""
        return transformer_modules(transformer, train_blocks=self.train_blocks)

    def swap_blocks(self, transformer, count):
        return dual_single_tails(transformer, count)

    def file_modules(self, transformer):
        """kohya's modules of every double and single block (whatever train_blocks says)."""

        return transformer_modules(transformer)

    def lycoris_modules(self, transformer, preset):
        """Every Linear of the double and single blocks (LyCORIS' DoubleStreamBlock and
        SingleStreamBlock classes, which every preset but attn-only names); attn-only: the
        double blocks' SelfAttention Linears (qkv, proj)."""
        modules = transformer_modules(transformer)
        if preset == "attn-only":
            return [m for m in modules if "_attn." in m.original]
        return modules

    def sampling_pipeline(self):
        """FluxPipeline fed our conditioning, with kohya's Flux prompt options
        (library.models.families.flux.sampling); an edit variant's pipeline (its hook)."""
        hooks = self.edit_hooks
        if hooks is not None:
            return hooks.sampling_pipeline(self)
        return flux_pipeline_kind(guidance=self.has_guidance)

    # -- sizes, options ----------------------------------------------------------------------

    def metadata_keys(self, config):
        """kohya's Flux.1 keys, with its defaults where the [flow] key is unset."""
        o = FlowOptions.from_section(config.flow)
        return {
            "ss_model_type": self.model_type,
            "ss_apply_t5_attn_mask": self.t5_attention_mask,
            "ss_guidance_scale": self.guidance_scale,
            "ss_model_prediction_type": o.model_prediction_type,
            **flow_metadata(o),
        }

    def check_options(self, model, flow):
        super().check_options(model, flow)
        if flow.model_type not in (None, self.model_type):
            raise ConfigError(
                f"model_type = {flow.model_type!r}: {model.pretrained_model_name_or_path} is a "
                f"{self.label} model (model_type {self.model_type!r}); fix or remove model_type"
            )
        if flow.guidance_scale is not None and not self.has_guidance:
            raise ConfigError(
                "guidance_scale: Flux.1 schnell has no guidance input; remove guidance_scale"
            )


FLUX_DEV = FluxFamily(
    name="flux-dev",
    base_model_version="flux1",
    modelspec_architecture="flux-1-dev",
    default_resolution=1024,
    text_encoder_subfolders=("text_encoder", "text_encoder_2"),
    tokenizer_subfolders=("tokenizer", "tokenizer_2"),
    text_encoder_lora_prefixes=("lora_te1", "lora_te3"),
    uses_pooled_text_embedding=True,
    lora_implementation="https://github.com/black-forest-labs/flux",
    checkpoint_implementation="https://github.com/black-forest-labs/flux",
    latent_scale=0.3611,
    network_modules=("lycoris.kohya", "networks.lora", "networks.lora_flux"),
    variant="dev",
    guidance_scale=3.5,
    t5_max_length=T5_MAX_LENGTH["dev"],
)
FLUX_SCHNELL = dataclasses.replace(
    FLUX_DEV,
    name="flux-schnell",
    modelspec_architecture="flux-1-schnell",
    variant="schnell",
    t5_max_length=T5_MAX_LENGTH["schnell"],
)


def flux_family(variant: str, flow) -> FluxFamily:
    """The Flux.1 family of ``variant`` ("dev" or "schnell") with the [flow] section's text and
    guidance settings (unset: kohya's defaults)."""
    return with_flow(FLUX_DEV if variant == "dev" else FLUX_SCHNELL, flow)


def with_flow(base: FluxFamily, flow) -> FluxFamily:
    """``base`` with the [flow] section's text, guidance and block settings (unset: kohya's
    defaults, as ``base`` has them)."""
    changes = {}
    if flow.guidance_scale is not None:
        changes["guidance_scale"] = float(flow.guidance_scale)
    if flow.t5xxl_max_token_length is not None:
        changes["t5_max_length"] = int(flow.t5xxl_max_token_length)
    if flow.apply_t5_attn_mask:
        changes["t5_attention_mask"] = True
    if flow.train_t5xxl:
        changes["train_t5"] = True
    if flow.train_blocks is not None:
        changes["train_blocks"] = flow.train_blocks
    return dataclasses.replace(base, **changes) if changes else base
