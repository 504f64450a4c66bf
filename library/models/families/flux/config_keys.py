"""Flux.1's own [flow] keys: its autoencoder file, kohya's block choice, model type and the
distilled guidance value (the CLIP-L/T5 keys it shares with SD3 are transformer_keys.py's)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from library.config.section import Section


class FluxFlowKeys(Section):
    """The AE file, kohya's train_blocks and model_type, and the guidance value."""

    ae: str | None = Field(
        None,
        description="Flux.1: the autoencoder file (Black Forest Labs' ae.safetensors layout, or "
        "diffusers' AutoencoderKL names). Needed with a transformer file; with a diffusers "
        "folder it replaces the folder's vae/.",
    )
    train_blocks: Literal["all", "single", "double"] | None = Field(
        None,
        description="kohya's networks.lora_flux argument (in network_args): which transformer "
        "blocks get adapters, all, the 38 single-stream or the 19 double-stream ones. Unset: "
        "all.",
    )
    model_type: str | None = Field(
        None,
        description='kohya\'s model_type: which model of FLUX.1\'s architecture this is, "flux" '
        'for FLUX.1; "flux_kontext" says a transformer file is FLUX.1 Kontext [dev] (its file '
        "has FLUX.1 dev's names and shapes). Each family that reads the key takes its own value "
        "(the model's files tell the others apart, and the key must agree with them).",
    )
    guidance_scale: float | None = Field(
        None,
        ge=0,
        description="The distilled guidance value Flux.1 dev is trained with (its guidance "
        "embedding). Unset: 3.5; 1.0 is common for LoRA training. schnell has no guidance input.",
    )
