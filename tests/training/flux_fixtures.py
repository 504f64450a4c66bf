"""Tiny Flux.1 Components built in memory (the loaders have their own tests)."""

from __future__ import annotations

from pathlib import Path

import torch

from library.config.flow_schema import FlowSection
from library.models.components import Components
from library.models.families.flux.family import flux_family
from library.models.families.flux.sampling import flux_scheduler_config
from library.models.families.flux.shapes import PATCH_SIZE
from library.training.objectives import FlowMatchingObjective, FlowOptions
from tests.kits.flux.tiny import build_tiny_flux_components

ASSETS = Path(__file__).resolve().parents[1] / "assets"


def tiny_flux_components(variant: str = "dev", seed: int = 0, **flow_keys) -> Components:
    """A tiny Flux.1 with the committed test tokenizers; ``flow_keys`` are [flow] keys."""
    from transformers import CLIPTokenizer, T5TokenizerFast

    parts = build_tiny_flux_components(variant, seed)
    flow = FlowSection(**flow_keys)
    clip_tokenizer = CLIPTokenizer.from_pretrained(str(ASSETS / "tokenizer"))
    t5_tokenizer = T5TokenizerFast.from_pretrained(str(ASSETS / "t5_tokenizer"))
    for module in parts.values():
        module.requires_grad_(False)
        module.eval()
    return Components(
        denoiser=parts["transformer"],
        vae=parts["vae"],
        text_encoders=(parts["text_encoder"], parts["text_encoder_2"]),
        tokenizers=(clip_tokenizer, t5_tokenizer),
        objective=FlowMatchingObjective(
            FlowOptions.from_section(flow), flux_scheduler_config(variant), patch=PATCH_SIZE
        ),
        family=flux_family(variant, flow),
        model_dir=Path("tiny-flux"),
    )


def plain_flux_pipeline(components: Components):
    """diffusers' FluxPipeline over the same modules: its packing, ids and prompt encoding are
    an independent reference for ours."""
    from diffusers import FlowMatchEulerDiscreteScheduler, FluxPipeline

    clip, t5 = components.text_encoders
    clip_tokenizer, t5_tokenizer = components.tokenizers
    return FluxPipeline(
        scheduler=FlowMatchEulerDiscreteScheduler(),
        vae=components.vae,
        text_encoder=clip,
        tokenizer=clip_tokenizer,
        text_encoder_2=t5,
        tokenizer_2=t5_tokenizer,
        transformer=components.denoiser,
    )


def float32(components: Components) -> Components:
    for module in (components.denoiser, components.vae, *components.text_encoders):
        module.to(torch.float32)
    return components
