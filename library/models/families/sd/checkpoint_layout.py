"""What an original-layout (single-file) checkpoint holds, by family: prefixes and text towers.

Data shared by the loader (library/models/families/sd/single_file.py) and the exporter
(library/saving/checkpoint_export.py), so both read and write the same layout.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from library.errors import ModelError
from library.models.checkpoint_towers import TextTower
from library.models.original_names import UNET_PREFIX, VAE_PREFIX

LayoutName = Literal["sd1", "sd2", "sdxl"]
# the shipped component configs of the released models: library/models/configs
CONFIGS_DIR = Path(__file__).parents[2] / "configs"


@dataclass(frozen=True)
class FileLayout:
    name: LayoutName
    towers: tuple[TextTower, ...]

    def config_dir(self, v_prediction: bool) -> Path:
        """The shipped component configs (unet/vae/text_encoder*/scheduler JSON) to start from."""
        folder = {"sd1": "sd15", "sd2": "sd2-768-v" if v_prediction else "sd2-512"}
        return CONFIGS_DIR / folder.get(self.name, "sdxl-base")


LAYOUTS: dict[str, FileLayout] = {
    "sd1": FileLayout("sd1", (TextTower("clip", "cond_stage_model.transformer.", "text_encoder"),)),
    "sd2": FileLayout(
        "sd2",
        (TextTower("openclip", "cond_stage_model.model.", "text_encoder", extra_last_block=True),),
    ),
    "sdxl": FileLayout(
        "sdxl",
        (
            TextTower("clip", "conditioner.embedders.0.transformer.", "text_encoder"),
            TextTower(
                "openclip", "conditioner.embedders.1.model.", "text_encoder_2", with_projection=True
            ),
        ),
    ),
}


# Key starts only SD 1.x/2.x/SDXL checkpoints have: the UNet's input blocks, the text encoders.
# (first_stage_model. is not one: SD3's and some FLUX.1 files hold their VAE under it too.)
_OWN_STARTS = (f"{UNET_PREFIX}input_blocks.", "cond_stage_model.", "conditioner.embedders.")
# The same in a damaged file's header text (its JSON keys are quoted).
DAMAGED_MARKS = re.compile("|".join(f'"{re.escape(start)}' for start in _OWN_STARTS))


def detect_sd(keys: Iterable[str]) -> bool | None:
    """True when ``keys`` include a part of an SD 1.x/2.x/SDXL checkpoint (so its loader's
    errors say which part is missing); None otherwise."""
    return any(k.startswith(_OWN_STARTS) for k in keys) or None


def _has(keys: set[str], prefix: str) -> bool:
    return any(k.startswith(prefix) for k in keys)


def detect_layout(keys: Iterable[str], path: Path) -> FileLayout:
    """SD 1.x / 2.x / SDXL from the keys; ModelError naming the file for anything else."""
    keys = set(keys)
    if _has(keys, "conditioner.embedders.1.model."):
        found = LAYOUTS["sdxl"]
    elif _has(keys, "conditioner.embedders.0.model."):
        raise ModelError(f"{path} is an SDXL refiner checkpoint; only base models can be trained")
    elif _has(keys, "cond_stage_model.model."):
        found = LAYOUTS["sd2"]
    elif _has(keys, "cond_stage_model.transformer."):
        found = LAYOUTS["sd1"]
    else:
        raise ModelError(f"{path} is not an SD 1.x/2.x/SDXL checkpoint: {_describe(keys)}")
    for part, prefix in (("UNet", UNET_PREFIX), ("VAE", VAE_PREFIX)):
        if not _has(keys, prefix):
            raise ModelError(
                f"{path} has no {part} weights ({prefix}*); it is not a complete checkpoint"
            )
    for tower in found.towers:
        if not _has(keys, tower.prefix):
            raise ModelError(
                f"{path} lacks its text encoder {tower.prefix}*; the file is incomplete"
            )
    return found


def _describe(keys: set[str]) -> str:
    """What a foreign file seems to be, for the error message."""
    sample = ", ".join(sorted(keys)[:3]) or "no tensors"
    if _has(keys, "lora_unet_") or _has(keys, "lora_te"):
        return "it is a LoRA file (set network_weights to continue training it)"
    if _has(keys, "down_blocks.") or _has(keys, "unet.down_blocks."):
        return f"its keys are diffusers names ({sample}); point at the whole diffusers folder"
    if _has(keys, "encoder.down.") or _has(keys, "encoder.down_blocks."):
        return "it is a VAE file (set vae to use it)"
    return (
        "none of its keys start with model.diffusion_model., first_stage_model., "
        f"cond_stage_model. or conditioner.embedders. (found {sample})"
    )
