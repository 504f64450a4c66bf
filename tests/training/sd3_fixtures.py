"""Tiny SD3/SD3.5 Components built in memory (the loaders have their own tests)."""

from __future__ import annotations

from pathlib import Path

from library.config.flow_schema import FlowSection
from library.models.components import Components
from library.models.families.sd3.family import pad_with_id_zero, sd3_family
from library.models.families.sd3.objective import SD3FlowObjective
from library.models.families.sd3.sampling import sd3_scheduler_config
from library.training.objectives import FlowOptions
from tests.kits.sd3.tiny import build_tiny_sd3_components

ASSETS = Path(__file__).resolve().parents[1] / "assets"


def tiny_sd3_tokenizers():
    """(CLIP-L, CLIP-G, T5) tokenizers from the committed test assets; CLIP-G pads with id 0."""
    from transformers import CLIPTokenizer, T5TokenizerFast

    clip_l = CLIPTokenizer.from_pretrained(str(ASSETS / "tokenizer"))
    clip_g = pad_with_id_zero(CLIPTokenizer.from_pretrained(str(ASSETS / "tokenizer")))
    return clip_l, clip_g, T5TokenizerFast.from_pretrained(str(ASSETS / "t5_tokenizer"))


def tiny_sd3_components(variant: str = "sd3.5-medium", seed: int = 0, **flow_keys) -> Components:
    """A tiny SD3 ``variant`` with the committed test tokenizers; ``flow_keys`` are [flow] keys."""
    parts = build_tiny_sd3_components(variant, seed)
    flow = FlowSection(**flow_keys)
    for module in parts.values():
        module.requires_grad_(False)
        module.eval()
    encoders = (parts["text_encoder"], parts["text_encoder_2"], parts["text_encoder_3"])
    return Components(
        denoiser=parts["transformer"],
        vae=parts["vae"],
        text_encoders=encoders,
        tokenizers=tiny_sd3_tokenizers(),
        objective=SD3FlowObjective(FlowOptions.from_section(flow), sd3_scheduler_config()),
        family=sd3_family(variant, flow, encoders),
        model_dir=Path(f"tiny-{variant}"),
    )


def plain_sd3_pipeline(components: Components):
    """diffusers' StableDiffusion3Pipeline over the same modules: its prompt encoding is an
    independent reference for ours."""
    from diffusers import FlowMatchEulerDiscreteScheduler, StableDiffusion3Pipeline

    clip_l, clip_g, t5 = components.text_encoders
    tok_l, tok_g, tok_t5 = components.tokenizers
    return StableDiffusion3Pipeline(
        transformer=components.denoiser,
        scheduler=FlowMatchEulerDiscreteScheduler(shift=3.0),
        vae=components.vae,
        text_encoder=clip_l,
        tokenizer=tok_l,
        text_encoder_2=clip_g,
        tokenizer_2=tok_g,
        text_encoder_3=t5,
        tokenizer_3=tok_t5,
    )
