"""SD 1.x/2.x/SDXL's kit for the family conformance suite (library.models.families.testkit)."""

from __future__ import annotations

import torch

from library.models import original_names as names
from library.models.families.sd.family import SD1, SDXL
from library.models.families.testkit import ConformanceKit, NameTable
from library.models.tiny import build_tiny_components, save_tiny_model


def _build(variant, seed):
    parts = build_tiny_components(variant, seed)
    return {k: v for k, v in parts.items() if isinstance(v, torch.nn.Module)}


def _unet_to_original(state, config):
    return {names.unet_path_to_original(k, config): v for k, v in state.items()}


def _unet_from_original(original, config):
    return {names.unet_path_from_original(k, config): v for k, v in original.items()}


def _reference_unet(original, config):
    from diffusers.loaders.single_file_utils import convert_ldm_unet_checkpoint

    prefixed = {names.UNET_PREFIX + k: v for k, v in original.items()}
    return convert_ldm_unet_checkpoint(prefixed, dict(config))


def _levels(config) -> int:
    return len(config["block_out_channels"])


def _reference_vae(original, config):
    from diffusers.loaders.single_file_utils import convert_ldm_vae_checkpoint

    prefixed = {names.VAE_PREFIX + k: v for k, v in original.items()}
    return convert_ldm_vae_checkpoint(prefixed, dict(config))


def _family(variant, modules):

    return SDXL if variant == "sdxl" else SD1


def _inputs(unet, seed):
    config = unet.config
    gen = torch.Generator().manual_seed(seed)
    inputs = {
        "sample": torch.randn(1, config.in_channels, 8, 8, generator=gen),
        "timestep": torch.tensor([500]),
        "encoder_hidden_states": torch.randn(1, 7, config.cross_attention_dim, generator=gen),
    }
    if config.addition_embed_type == "text_time":
        pooled = config.projection_class_embeddings_input_dim - 6 * config.addition_time_embed_dim
        inputs["added_cond_kwargs"] = {
            "text_embeds": torch.randn(1, pooled, generator=gen),
            "time_ids": torch.tensor([[64.0, 64.0, 0.0, 0.0, 64.0, 64.0]]),
        }
    return inputs


KIT = ConformanceKit(
    variants=("sd1", "sd2", "sdxl"),
    build=_build,
    write_folder=lambda path, variant, seed: save_tiny_model(path, variant, seed),
    pipeline=lambda v: "StableDiffusionXLPipeline" if v == "sdxl" else "StableDiffusionPipeline",
    family=_family,
    denoiser_inputs=_inputs,
    denoiser_names=NameTable(
        to_original=_unet_to_original,
        from_original=_unet_from_original,
        reference=_reference_unet,
    ),
    vae_names=NameTable(
        to_original=lambda state, config: names.vae_state_dict_to_original(state, _levels(config)),
        from_original=lambda orig, config: names.vae_state_dict_from_original(
            orig, _levels(config)
        ),
        reference=_reference_vae,
    ),
    lora_conv=True,
)
