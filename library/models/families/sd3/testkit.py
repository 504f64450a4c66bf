"""SD3/SD3.5's kit for the family conformance suite (library.models.families.testkit)."""

from __future__ import annotations

import torch

from library.config.flow_schema import FlowSection
from library.models.families.sd3 import original_keys
from library.models.families.sd3.family import sd3_family
from library.models.families.sd3.shapes import VARIANTS
from library.models.families.sd3.tiny import build_tiny_sd3_components
from library.models.families.sd3.tiny_files import write_tiny_sd3_folder
from library.models.families.testkit import ConformanceKit, NameTable

# The default variant first: 3.5 Medium has every kind of block (dual attention, qk norms).
_VARIANTS = ("sd3.5-medium", *(v for v in VARIANTS if v != "sd3.5-medium"))


def _reference_transformer(original, config):
    """diffusers' converter (on the keys as they are inside a model file), which pops every
    key it reads: none may be left."""
    from diffusers.loaders.single_file_utils import convert_sd3_transformer_checkpoint_to_diffusers

    checkpoint = {original_keys.ORIGINAL_PREFIX + k: v for k, v in original.items()}
    converted = convert_sd3_transformer_checkpoint_to_diffusers(checkpoint)
    assert checkpoint == {}, f"diffusers left {sorted(checkpoint)[:5]}"
    return converted


def _reference_vae(original, config):
    from diffusers.loaders.single_file_utils import convert_ldm_vae_checkpoint

    prefixed = {original_keys.VAE_PREFIX + k: v for k, v in original.items()}
    return convert_ldm_vae_checkpoint(prefixed, dict(config))


def _family(variant, modules):

    encoders = tuple(modules[f"text_encoder{s}"] for s in ("", "_2", "_3"))
    return sd3_family(variant, FlowSection(), encoders)


def _inputs(transformer, seed):
    config = transformer.config
    gen = torch.Generator().manual_seed(seed)
    return {
        "hidden_states": torch.randn(1, config.in_channels, 8, 8, generator=gen),
        "encoder_hidden_states": torch.randn(1, 6, config.joint_attention_dim, generator=gen),
        "pooled_projections": torch.randn(1, config.pooled_projection_dim, generator=gen),
        "timestep": torch.tensor([500.0]),
    }


KIT = ConformanceKit(
    variants=_VARIANTS,
    build=lambda variant, seed: build_tiny_sd3_components(variant, seed),
    write_folder=write_tiny_sd3_folder,
    pipeline=lambda variant: "StableDiffusion3Pipeline",
    family=_family,
    denoiser_inputs=_inputs,
    denoiser_names=NameTable(
        to_original=lambda state, config: original_keys.transformer_to_original(state),
        from_original=lambda state, config: original_keys.transformer_from_original(state),
        reference=_reference_transformer,
    ),
    vae_names=NameTable(
        to_original=lambda state, config: original_keys.ae_to_original(state),
        from_original=lambda state, config: original_keys.ae_from_original(state),
        reference=_reference_vae,
    ),
)
