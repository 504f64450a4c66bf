"""Krea 2's registry entry (readable without torch: its modules are named, not imported)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from library.config.section import Section
from library.models.families.family_entry import (
    Deferred,
    FamilyEntry,
    LoraFiles,
    ToolFacts,
)
from library.models.families.text_encoder_keys import TextEncoderFileKeys
from library.training.flow_keys import SIGMA_KEYS

_LINE = "Krea 2"
_PACKAGE = "library.models.families.krea2"
# The [flow] keys of the shared flow-matching draw, and beside a single transformer file its Qwen3-VL file (the VAE file is [model] vae) and
# which checkpoint the file is
FLOW_KEYS = frozenset(SIGMA_KEYS) | {"text_encoder", "dit_variant", "turbo_dit"}


class Krea2FlowKeys(Section):
    """musubi-tuner's --dit_variant and --turbo_dit."""

    dit_variant: Literal["raw", "turbo"] | None = Field(
        None,
        description="Krea 2: which checkpoint a transformer file is (musubi-tuner's "
        "--dit_variant): raw (Krea 2 RAW, the one to train) or turbo (the distilled 8-step "
        "checkpoint: samples use its fixed shift and no guidance). A diffusers folder says it "
        "itself (model_index.json is_distilled). Unset: raw.",
    )
    turbo_dit: str | None = Field(
        None,
        description="Krea 2 LoRAs: the Turbo transformer (turbo.safetensors, or a "
        "Krea-2-Turbo diffusers folder) whose weights samples during training are drawn with, "
        "the LoRA being trained on top (musubi-tuner's --turbo_dit): previews of how the LoRA "
        "looks where it is used. Prompts then default to no guidance (--l 1); use about 8 "
        "steps (--s 8). Not with fp8_base, base_model_precision, blocks_to_swap or fsdp.",
    )


# Module names only Krea 2 LoRA files hold: its text fusion's (the original txtfusion, the
# diffusers text_fusion), in every layout its files come in (the marks are name starts).
_DENOISER_MARKS = tuple(
    (start, _LINE)
    for start in ("diffusion_model.txtfusion.", "base_model.model.txtfusion.",
                  "transformer.text_fusion.", "lora_unet_txtfusion_")
)  # fmt: skip

KREA2 = FamilyEntry(
    name="krea2",
    label="Krea 2",
    models=_LINE,
    lines=(_LINE,),
    family=Deferred(f"{_PACKAGE}.family:Krea2Family").get,
    claims=Deferred(f"{_PACKAGE}.load:claims_krea2"),
    load=Deferred(f"{_PACKAGE}.load:load_krea2"),
    reads_vae=True,
    # musubi-tuner's LoRA module for Krea 2
    network_module="networks.lora_krea2",
    flow_matching=True,
    config_keys=(TextEncoderFileKeys, Krea2FlowKeys),
    flow_keys=FLOW_KEYS,
    # musubi-tuner's Krea 2 draw: its schedule's shift at the image's tokens (spec.krea2_mu)
    timestep_draws=("krea2_shift",),
    lora_files=LoraFiles(denoiser_marks=_DENOISER_MARKS, architectures=(("Krea-2", _LINE),)),
    tool=ToolFacts(
        component_options={
            "text_encoder": "the Qwen3-VL text encoder file beside a transformer file"
        },
        variant_labels={"krea2": "Krea 2"},
        version_marks=(("krea2", _LINE),),
        # the original names (Krea's and ComfyUI's), whose kohya form musubi-tuner writes
        to_original=Deferred(f"{_PACKAGE}.keys:state_to_original"),
        own_layout="comfyui",
        folds_alpha=True,
        layout_names={
            "comfyui": "diffusion_model.<original path>, peft's tensors, alpha folded in",
            "kohya": "musubi-tuner's lora_unet_<original path>",
            "diffusers": "diffusers' transformer.<diffusers path>",
        },
    ),
)
