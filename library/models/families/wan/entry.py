"""Wan's registry entry (readable without torch: its modules are named, not imported)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from library.config.section import Section
from library.config.unsupported import Unsupported, group
from library.models.families.family_entry import (
    Deferred,
    FamilyEntry,
    KohyaVocabulary,
    LoraFiles,
    ToolFacts,
)
from library.training.flow_keys import SIGMA_KEYS

_LINE = "Wan"
_PACKAGE = "library.models.families.wan"
# The [flow] keys of the shared flow-matching draw, umT5's file and tokenizer, and the task
FLOW_KEYS = frozenset(SIGMA_KEYS) | {"t5", "t5_tokenizer_path", "task", "dit_high_noise", "clip"}
TASKS = ("t2v-1.3B", "t2v-14B", "i2v-14B", "t2v-A14B", "ti2v-5B", "i2v-A14B")


class WanFlowKeys(Section):
    """musubi-tuner's --t5, --clip, --task and --dit_high_noise."""

    t5: str | None = Field(
        None,
        description="Wan: the umT5-XXL text encoder file beside a transformer file "
        "(umt5_xxl_fp16.safetensors in transformers' names, or Wan-AI's "
        "models_t5_umt5-xxl-enc-bf16.pth; musubi-tuner's --t5). Needed with "
        "such a transformer file; with a diffusers folder it replaces the folder's "
        "text_encoder/.",
    )
    clip: str | None = Field(
        None,
        description="Wan 2.1 I2V-14B: the CLIP vision encoder file beside a transformer file "
        "(Comfy-Org's clip_vision_h.safetensors; musubi-tuner's --clip), whose states of the "
        "clip's first frame the transformer reads. Needed with such a transformer file; with a "
        "diffusers folder it replaces the folder's image_encoder/.",
    )
    dit_high_noise: str | None = Field(
        None,
        description="Wan 2.2 A14B: the high-noise expert's transformer file "
        "(wan2.2_t2v_high_noise_14B_fp16.safetensors; musubi-tuner's --dit_high_noise), the "
        "low-noise one's being pretrained_model_name_or_path (musubi-tuner's --dit). Both "
        "given: a model of two experts ([experts] picks which train), split at 0.875 (I2V: 0.9) "
        "unless timestep_boundary is set. A diffusers folder holds both (transformer/, "
        "transformer_2/).",
    )
    task: Literal[TASKS] | None = Field(  # type: ignore[valid-type]
        None,
        description="Wan: which model the transformer is (musubi-tuner's --task): t2v-1.3B, "
        "t2v-14B, i2v-14B (Wan 2.1 image-to-video: the clip's first frame and its CLIP states "
        "condition it), t2v-A14B (a Wan 2.2 expert), i2v-A14B (a Wan 2.2 image-to-video expert: the "
        "clip's first frame conditions it) or ti2v-5B (Wan 2.2 TI2V-5B, trained as text to "
        "video); checked against the transformer's width and input channels. "
        "Unset: read off the file.",
    )


# musubi-tuner's Wan trainer (wan_train_network.py): options of what is not trained here yet
_LATER = (
    "an option of musubi-tuner's one-frame training; difftune trains Wan 2.1 text to video "
    "and image to video (I2V-14B), Wan 2.2 T2V-A14B's and I2V-A14B's experts and TI2V-5B"
)
_OPTIONS = {
    **group("one_frame", _LATER, (False,)),
    # Wan 2.2's per-token time embedding equals Wan 2.1's (one per sample) when every token
    # shares the sample's time, as in each model trained here; diffusers embeds it once too.
    "force_v2_1_time_embedding": Unsupported(
        "every token of the Wan models trained here shares its sample's time, so Wan 2.1's "
        "time embedding (one per sample, as diffusers computes it) is the same as Wan 2.2's",
        (False,),
        ignored=True,
    ),
    **group("vae_cache_cpu", "it only changes where musubi-tuner keeps the VAE's cache; the "
            "result is the same", (False,), ignored=True),
}  # fmt: skip

# Module names only Wan LoRA files hold, in every layout they come in (name starts).
_DENOISER_MARKS = tuple(
    (start, _LINE)
    for start in ("lora_unet_blocks_0_self_attn_", "diffusion_model.blocks.0.self_attn.",
                  "transformer.blocks.0.attn1.", "lora_unet_blocks_0_attn1_")
)  # fmt: skip

WAN = FamilyEntry(
    name="wan",
    label=_LINE,
    models="Wan 2.1 / 2.2",
    lines=(_LINE,),
    family=Deferred(f"{_PACKAGE}.family:WanFamily").get,
    model_family=Deferred(f"{_PACKAGE}.family:family_class"),
    claims=Deferred(f"{_PACKAGE}.spec:claims_wan"),
    load=Deferred(f"{_PACKAGE}.family:load_wan"),
    reads_vae=True,
    # musubi-tuner's LoRA module for Wan
    network_module="networks.lora_wan",
    flow_matching=True,
    config_keys=(WanFlowKeys,),
    kohya=KohyaVocabulary(options=_OPTIONS),
    flow_keys=FLOW_KEYS,
    lora_files=LoraFiles(denoiser_marks=_DENOISER_MARKS, architectures=(("wan", _LINE),)),
    tool=ToolFacts(
        component_options={"t5": "the umT5-XXL text encoder file beside a transformer file",
                           "clip": "Wan 2.1 I2V-14B's CLIP vision encoder file"},
        variant_labels={"wan": _LINE},
        version_marks=(("wan", _LINE),),
        to_original=Deferred(f"{_PACKAGE}.keys:state_to_original"),
    ),
)
