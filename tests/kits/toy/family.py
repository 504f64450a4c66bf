"""Toy as a ModelFamily: what is its own (the denoiser call, its adapters' names) over shared
parts: the T5 kind (captions -> states and padding mask), 2x2 patch tokens with their position
ids, the rectified-flow objective, and the loader every spec shares."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from library.models.components import Components
from library.models.conditioning import Conditioning, TextConditioning
from library.models.experts import HIGH_NOISE, LOW_NOISE, Experts
from library.models.families.spec_loader import load_spec
from library.models.families.transformer_family import TransformerFamily
from library.models.model_files import load_weights, read_json
from library.models.patch_tokens import PATCH, image_position_ids, pack_latents, unpack_latents
from library.models.text_encoders.t5 import t5_states
from library.training.objectives import FlowMatchingObjective, FlowOptions
from tests.kits.toy.spec import PAIRS, SOLOS, SPEC

T5_TOKENS = 32  # T5 tokens per caption
TIMESTEP_SCALE = 1000.0  # the transformer's time embedding takes sigma in [0, 1000]
SCHEDULER = {"num_train_timesteps": 1000, "shift": 1.0, "use_dynamic_shifting": False}
BLOCK_LISTS = ((PAIRS, "transformer_blocks"), (SOLOS, "single_transformer_blocks"))


@dataclass(frozen=True, kw_only=True)
class ToyFamily(TransformerFamily):
    FLOW_KIND: ClassVar[str] = "toy"
    LABEL: ClassVar[str] = "Toy"
    DENOISER_ONLY_ADAPTERS: ClassVar[str | None] = "T5 gets no adapters"
    MAIN_FILE: ClassVar = SPEC  # a full fine-tune: the spec's main file, in the original names
    LORA_LISTS: ClassVar = BLOCK_LISTS  # kohya's modules: every block's Linears, by its table

    def encode_text(
        self, tokenizers, text_encoders, captions, device, clip_skip=None, max_token_length=None
    ):
        (tokenizer,), (t5,) = tokenizers, text_encoders
        hidden, mask = t5_states(tokenizer, t5, captions, T5_TOKENS, device)
        return TextConditioning(hidden, None, mask)

    def assemble_conditioning(self, text, batch, device, dtype=None):
        hidden = text.hidden.to(device)
        return Conditioning(hidden if dtype is None else hidden.to(dtype), {})

    def predict(self, denoiser, noisy, timesteps, cond):
        batch, channels, height, width = noisy.shape
        text = cond.encoder_hidden_states
        out = denoiser(
            hidden_states=pack_latents(noisy),
            encoder_hidden_states=text,
            timestep=timesteps.to(noisy.dtype) * TIMESTEP_SCALE,
            img_ids=image_position_ids(height, width, noisy.device, noisy.dtype),
            txt_ids=torch.zeros(text.shape[1], 3, device=noisy.device, dtype=noisy.dtype),
            return_dict=False,
        )[0]
        return unpack_latents(out, channels, height, width)

    def lycoris_modules(self, transformer, preset):
        return self.transformer_modules(transformer)


TOY = ToyFamily(
    name="toy",
    base_model_version="toy",
    modelspec_architecture="toy",
    default_resolution=64,
    text_encoder_lora_prefixes=("lora_te3",),
    latent_scale=0.3611,
)


def load_toy(model, flow, weight_dtype: torch.dtype, vae_dtype: torch.dtype) -> Components:
    """A Toy folder or single file, read by the shared loader as the spec declares it."""
    loaded = load_spec(SPEC, model, flow, weight_dtype, vae_dtype)
    transformer, vae, t5 = loaded.modules.values()
    experts = _experts(loaded.model_dir, transformer, weight_dtype)
    return Components(
        denoiser=transformer if experts is None else experts.modules[LOW_NOISE],
        vae=vae,
        text_encoders=(t5,),
        tokenizers=tuple(loaded.tokenizers.values()),
        objective=FlowMatchingObjective(FlowOptions.from_section(flow), SCHEDULER, patch=PATCH),
        family=TOY,
        model_dir=loaded.model_dir,
        experts=experts,
    )


def _experts(model_dir, transformer, weight_dtype: torch.dtype) -> Experts | None:
    """A folder with a second transformer holds two experts, as Wan 2.2's A14B folders do:
    ``transformer`` the high-noise one, ``transformer_2`` the low-noise one, and the boundary
    in model_index.json's ``boundary_ratio``."""
    if not (model_dir.is_dir() and (model_dir / "transformer_2").is_dir()):
        return None
    from diffusers import BriaTransformer2DModel

    low = load_weights(
        BriaTransformer2DModel, model_dir, "transformer_2", weight_dtype, "diffusion_pytorch_model"
    )
    low.requires_grad_(False).eval()
    ratio = read_json(model_dir / "model_index.json").get("boundary_ratio")
    return Experts({HIGH_NOISE: transformer, LOW_NOISE: low}, ratio)
