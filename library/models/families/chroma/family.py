"""Chroma as a ModelFamily: what the trainer asks of the model, and its loader.

The facts it relies on (docs/chroma.md; diffusers 0.42.1's ChromaPipeline): latents are the
AE's ``(z - 0.1159) * 0.3611`` packed into 2x2-patch tokens with ids (0, row, column), text
tokens at (0, 0, 0), as FLUX.1; text is T5-XXL alone with the caption's padding mask
(conditioning.py); the timestep is sigma in [0, 1] with no guidance input; the raw output is
the velocity noise - x0, so training is FLUX.1's rectified flow (FlowMatchingObjective); LoRA
files carry kohya's names of the original model (original_keys.py's block Linears).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import ClassVar

import torch

from library.config.flow_section import FlowSection
from library.config.model_schema import ModelSection
from library.errors import ConfigError
from library.models.components import Components
from library.models.conditioning import Conditioning, TextConditioning
from library.models.families.chroma import conditioning as text_
from library.models.families.chroma.checkpointing import single_blocks_masked
from library.models.families.chroma.conditioning import TEXT_MASK
from library.models.families.chroma.sampling import chroma_pipeline_kind
from library.models.families.chroma.shapes import PATCH_SIZE, SCHEDULER_CONFIG, T5_MAX_LENGTH
from library.models.families.chroma.spec import SPEC
from library.models.families.spec_loader import (
    components,
    folder_scheduler,
    load_spec,
)
from library.models.families.transformer_family import (
    TransformerFamily,
    dual_single_tails,
    flow_metadata,
)
from library.models.patch_tokens import image_position_ids, pack_latents, unpack_latents
from library.models.text_encoders.t5 import t5_states, tokenize_t5
from library.training.objectives import FlowMatchingObjective, FlowOptions


@dataclass(frozen=True, kw_only=True)
class ChromaFamily(TransformerFamily):
    """Chroma with the run's T5 caption length."""

    FLOW_KIND: ClassVar[str] = "chroma"
    LABEL: ClassVar[str] = "Chroma"
    DENOISER_ONLY_ADAPTERS: ClassVar[str | None] = "T5-XXL gets no adapters, as in kohya's Chroma trainer"
    # a full fine-tune: the transformer in the original names (original_keys.py), as
    # Chroma1-HD.safetensors is distributed; T5 and the AE stay the user's files
    MAIN_FILE: ClassVar = SPEC
    # kohya's modules (lora_unet_ + the original path, as networks.lora_flux names them and
    # ComfyUI and diffusers' FluxLoraLoaderMixin read them): every Linear of every block
    LORA_LISTS: ClassVar = (
        ("double_blocks", "transformer_blocks"),
        ("single_blocks", "single_transformer_blocks"),
    )

    t5_max_length: int = T5_MAX_LENGTH  # T5 tokens per caption (t5xxl_max_token_length)

    def describe(self) -> str:
        return f"Chroma ({self.t5_max_length} T5 tokens, padding masked)"

    @property
    def text_cache_name(self) -> str:
        return f"{self.name}|t5_tokens={self.t5_max_length}|t5_mask"

    # -- conditioning ------------------------------------------------------------------------

    def encode_text(
        self, tokenizers, text_encoders, captions, device, clip_skip=None, max_token_length=None
    ):
        """T5's last hidden states of ``captions``, run with their padding mask, and the mask."""
        (tokenizer,), (t5,) = tokenizers, text_encoders
        hidden, mask = t5_states(tokenizer, t5, captions, self.t5_max_length, device)
        return TextConditioning(hidden, None, mask)

    def text_mask(self, tokenizers, captions, device):
        return tokenize_t5(tokenizers[0], captions, self.t5_max_length).attention_mask.to(device)

    def assemble_conditioning(self, text, batch, device, dtype=None):
        hidden = text.hidden.to(device)
        if dtype is not None:
            hidden = hidden.to(dtype)
        if text.mask is None:
            raise ValueError("Chroma needs the T5 padding mask of the captions")
        return Conditioning(hidden, {TEXT_MASK: text.mask.to(device)})

    def predict(self, denoiser, noisy, timesteps, cond):
        """The transformer's raw output [B, C, h, w] (the velocity noise - x0 at its best) at
        noise levels ``timesteps`` (sigma)."""
        batch, channels, height, width = noisy.shape
        tokens = pack_latents(noisy)
        text = cond.encoder_hidden_states
        mask = text_.attention_mask(cond.unet_kwargs[TEXT_MASK], tokens.shape[1])
        with single_blocks_masked(denoiser, mask):
            out = denoiser(
                hidden_states=tokens,
                encoder_hidden_states=text,
                timestep=timesteps.to(noisy.dtype),
                img_ids=image_position_ids(height, width, noisy.device, noisy.dtype),
                txt_ids=torch.zeros(text.shape[1], 3, device=noisy.device, dtype=noisy.dtype),
                attention_mask=mask,
                return_dict=False,
            )[0]
        return unpack_latents(out, channels, height, width)

    # -- adapters ----------------------------------------------------------------------------

    def swap_blocks(self, transformer, count):
        return dual_single_tails(transformer, count)

    def sampling_pipeline(self):
        """ChromaPipeline fed our conditioning and boolean padding masks (sampling.py)."""
        return chroma_pipeline_kind()

    # -- sizes, options ----------------------------------------------------------------------

    def metadata_keys(self, config):
        """kohya's keys of its Chroma trainer (flux_train_network, model_type chroma)."""
        o = FlowOptions.from_section(config.flow)
        return {
            "ss_model_type": "chroma",
            "ss_apply_t5_attn_mask": True,
            "ss_model_prediction_type": o.model_prediction_type,
            **flow_metadata(o),
        }

    def check_options(self, model, flow):
        super().check_options(model, flow)
        if flow.model_type not in (None, "chroma"):
            raise ConfigError(
                f"model_type = {flow.model_type!r}: {model.pretrained_model_name_or_path} is a "
                "Chroma model (kohya's model_type 'chroma'); fix or remove model_type"
            )
        if flow.apply_t5_attn_mask is False:
            raise ConfigError(
                "apply_t5_attn_mask = false: Chroma always masks T5's padding (it was trained "
                "so, and kohya forces it for Chroma); remove apply_t5_attn_mask"
            )


CHROMA = ChromaFamily(
    name="chroma",
    base_model_version="chroma",  # kohya's model_type
    modelspec_architecture="chroma",
    default_resolution=1024,
    text_encoder_subfolders=("text_encoder",),
    tokenizer_subfolders=("tokenizer",),
    text_encoder_lora_prefixes=("lora_te3",),  # kohya's T5 prefix (no adapters trained here)
    lora_implementation="https://github.com/lodestone-rock/flow",
    checkpoint_implementation="https://github.com/lodestone-rock/flow",
    latent_scale=0.3611,
    network_modules=("lycoris.kohya", "networks.lora", "networks.lora_flux"),
)


def chroma_family(flow) -> ChromaFamily:
    """The Chroma family with the [flow] section's caption length (unset: 512)."""
    if flow.t5xxl_max_token_length is not None:
        return dataclasses.replace(CHROMA, t5_max_length=int(flow.t5xxl_max_token_length))
    return CHROMA


def load_chroma(
    model: ModelSection, flow: FlowSection, weight_dtype: torch.dtype, vae_dtype: torch.dtype
) -> Components:
    """Components of a Chroma diffusers folder or transformer file, as spec.py declares them
    (read by the shared loader, families/spec_loader.py): the transformer, the AE, T5-XXL and
    its tokenizer, frozen, in eval mode, on the CPU, in ``weight_dtype`` (the AE in
    ``vae_dtype``). ModelError for any problem with the files, found before a weight is read."""
    loaded = load_spec(SPEC, model, flow, weight_dtype, vae_dtype)
    scheduler = folder_scheduler(loaded.model_dir, SCHEDULER_CONFIG)
    objective = FlowMatchingObjective(FlowOptions.from_section(flow), scheduler, patch=PATCH_SIZE)
    return components(SPEC, loaded, objective, chroma_family(flow))
