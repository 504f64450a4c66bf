"""SD 1.x/2.x/SDXL's entry in the family registry: what shared code asks of it before loading
it. Its claim is asked last (an SD3 or FLUX.1 file may hold an SD-like VAE, and its LoRA marks
decide after the transformers'); a model no family claims is reported by family_choice."""

from __future__ import annotations

from library.models.families.family_entry import (
    GENERIC_LORA_MODULE,
    Deferred,
    FamilyEntry,
    LoraFiles,
    ToolFacts,
)
from library.models.original_names import unet_path_to_original

SD12, SDXL = "SD 1.x/2.x", "SDXL"
# kohya's names of each line's UNet blocks: diffusers' paths for SD 1.x/2.x, Stability's SGM
# paths for SDXL.
_SDXL_UNET = tuple(f"lora_unet_{b}_" for b in ("input_blocks", "middle_block", "output_blocks"))
_SD12_UNET = tuple(f"lora_unet_{b}_" for b in ("down_blocks", "mid_block", "up_blocks"))


def _line(family) -> str:
    """Which of SD's lines a loaded family is: SDXL's has two text encoders."""
    return SDXL if len(family.text_encoder_subfolders) > 1 else SD12


def _comfy_original(layer) -> str:
    """ComfyUI names a UNet's layers in the original (SGM / LDM) layout."""
    return unet_path_to_original(layer.parts[0], layer.model.config)


def _comfy_keys(layer, original: str) -> dict[str, tuple[int, ...] | None]:
    """diffusers' names of the layer, as kohya, LyCORIS and diffusers' attention processors
    write them."""
    path = layer.parts[0]
    flat = path.replace(".", "_")
    attention = path.replace(".to_", ".processor.to_")
    if attention.endswith(".to_out.0"):
        attention = attention[:-2]
    return dict.fromkeys(
        (f"lora_unet_{flat}", f"lycoris_{flat}", attention, f"unet.{attention}"), None
    )


SD = FamilyEntry(
    name="sd",
    label="SD",
    models=f"{SD12}/{SDXL}",
    article="an",
    lines=(SD12, SDXL),
    family=Deferred("library.models.families.sd.family:SDFamily").get,
    claims=Deferred("library.models.families.sd.load:claims_sd"),
    claimed_last=True,
    load=Deferred("library.models.families.sd.load:load_sd"),
    network_module=GENERIC_LORA_MODULE,
    lora_files=LoraFiles(
        denoiser_marks=(*((start, SD12) for start in _SD12_UNET), *((s, SDXL) for s in _SDXL_UNET)),
        text_prefixes={("lora_te",): SD12, ("lora_te1", "lora_te2"): SDXL},
        architectures=(("stable-diffusion-xl", SDXL), ("stable-diffusion-v", SD12)),
        unet_key_layout=Deferred("library.models.families.sd.family:unet_lora_key_layout"),
    ),
    tool=ToolFacts(
        variant_labels={
            "sd1": "SD 1.x",
            "sd1-v": "SD 1.x (v-prediction)",
            "sd2": "SD 2.x",
            "sd2-v": "SD 2.x 768-v",
            "sdxl": "SDXL",
            "sdxl-v": "SDXL (v-prediction)",
        },
        line_of=_line,
        # SDXL's decide first: its files hold lora_te2_ beside names of either UNet layout.
        lora_marks=(
            *((start, SDXL) for start in (*_SDXL_UNET, "lora_te2_")),
            *((start, SD12) for start in (*_SD12_UNET, "lora_te_")),
        ),
        version_marks=(("sdxl", SDXL), ("sd_v1", SD12), ("sd_v2", SD12)),
        comfy_original=_comfy_original,
        comfy_keys=_comfy_keys,
    ),
)
