"""FLUX.1's kit for the family conformance suite (library.models.families.testkit)."""

from __future__ import annotations

from unittest import mock

import torch

from library.config.flow_schema import FlowSection
from library.models.families.flux import original_keys
from library.models.families.flux.family import flux_family
from library.models.families.flux.shapes import VARIANTS
from library.models.families.flux.tiny import build_tiny_flux_components
from library.models.families.flux.tiny_files import write_tiny_flux_folder
from library.models.families.testkit import ConformanceKit, NameTable


class TinyWidthTorch:
    """``torch`` as diffusers' FLUX.1 converter sees it, except that ``split`` scales the sizes.

    diffusers splits ``linear1`` at FLUX.1's width (3072, hard-coded); scaling its split sizes to
    the tensor keeps diffusers' order of the parts while letting it read a tiny model."""

    def __getattr__(self, name):
        return getattr(torch, name)

    @staticmethod
    def split(tensor, sizes, dim=0):
        total = sum(sizes)
        return torch.split(tensor, [s * tensor.shape[dim] // total for s in sizes], dim=dim)


def _reference_transformer(original, config):
    """diffusers' converter, which pops every key it reads: none may be left."""
    from diffusers.loaders import single_file_utils

    checkpoint = dict(original)
    with mock.patch.object(single_file_utils, "torch", TinyWidthTorch()):
        converted = single_file_utils.convert_flux_transformer_checkpoint_to_diffusers(checkpoint)
    assert checkpoint == {}, f"diffusers left {sorted(checkpoint)[:5]}"
    return converted


def _reference_ae(original, config):
    from diffusers.loaders.single_file_utils import convert_ldm_vae_checkpoint

    return convert_ldm_vae_checkpoint(dict(original), dict(config))


def _family(variant, modules):

    return flux_family(variant, FlowSection())


def _inputs(transformer, seed):
    config = transformer.config
    gen = torch.Generator().manual_seed(seed)
    image, text = 16, 8
    inputs = {
        "hidden_states": torch.randn(1, image, config.in_channels, generator=gen),
        "encoder_hidden_states": torch.randn(1, text, config.joint_attention_dim, generator=gen),
        "pooled_projections": torch.randn(1, config.pooled_projection_dim, generator=gen),
        "timestep": torch.tensor([0.7]),
        "img_ids": torch.randn(image, 3, generator=gen),
        "txt_ids": torch.zeros(text, 3),
    }
    if config.guidance_embeds:
        inputs["guidance"] = torch.tensor([3.5])
    return inputs


def _linear1_part(path: str) -> bool:
    """The parts of a single block's fused linear1: diffusers' kohya converter splits it at
    FLUX.1's width (tests/networks/test_flux_lora_keys.py reads it at full width)."""
    return path.startswith("single_transformer_blocks.") and path.endswith(
        ("attn.to_q", "attn.to_k", "attn.to_v", "proj_mlp")
    )


KIT = ConformanceKit(
    variants=VARIANTS,
    build=lambda variant, seed: build_tiny_flux_components(variant, seed),
    write_folder=write_tiny_flux_folder,
    pipeline=lambda variant: "FluxPipeline",
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
        reference=_reference_ae,
    ),
    diffusers_lora_skips=_linear1_part,
)
