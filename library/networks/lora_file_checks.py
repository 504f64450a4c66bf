"""What a ``network_weights`` file must be before any of it is loaded: finite, and made for the
base model's family.

A LoRA holding NaN or infinite values would train from the first step on a NaN loss, and the
message would blame the learning rate. A LoRA of another family would fail on its first module
with a message about layers; by its module names (kohya's names differ between SD 1.x/2.x,
SDXL, FLUX.1 and SD3) it is named as what it is.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from library.data.content_hash import all_finite
from library.errors import CheckpointError
from library.networks.kohya_keys import TEXT_ENCODER

# The start of a LoRA module name -> the family whose denoiser has that module (kohya's names:
# diffusers' paths for SD 1.x/2.x, Stability's SGM paths for SDXL, the original FLUX.1 and SD3
# paths; diffusers' FLUX.1 layout for files other trainers write).
_DENOISER_NAMES = (
    (("lora_unet_down_blocks_", "lora_unet_mid_block_", "lora_unet_up_blocks_"), "SD 1.x/2.x"),
    (("lora_unet_input_blocks_", "lora_unet_middle_block_", "lora_unet_output_blocks_"), "SDXL"),
    (("lora_unet_double_blocks_", "lora_unet_single_blocks_"), "FLUX.1"),
    (("transformer.single_transformer_blocks.",), "FLUX.1"),
    (("lora_unet_joint_blocks_",), "SD3/SD3.5"),
)
# modelspec.architecture of a base model -> the family a LoRA names it by
_ARCHITECTURES = (
    ("stable-diffusion-xl", "SDXL"),
    ("stable-diffusion-v", "SD 1.x/2.x"),
    ("stable-diffusion-3", "SD3/SD3.5"),
    ("flux-1", "FLUX.1"),
)


def check_lora_file(tensors: Mapping[str, torch.Tensor], source: str, architecture: str) -> None:
    """CheckpointError naming ``source`` when a tensor is not finite, or when the file's module
    names are another family's than the base model's (its modelspec ``architecture``)."""
    broken = [k for k, t in tensors.items() if not all_finite(t)]
    if broken:
        more = f" and {len(broken) - 1} more" if len(broken) > 1 else ""
        raise CheckpointError(
            f"network_weights: {source} holds NaN or infinite values ({broken[0]}{more}); the "
            "file is damaged (or was saved from a run that diverged): use an earlier save of it"
        )
    made_for, example = lora_family(tensors)
    this = next((label for start, label in _ARCHITECTURES if architecture.startswith(start)), None)
    if made_for is not None and this is not None and made_for != this:
        raise CheckpointError(
            f"network_weights: {source} is a LoRA for {made_for} models ({example}, ...), but "
            f"the base model is {this}; use a {made_for} base model or a LoRA made for {this}"
        )


def lora_family(tensors: Mapping[str, torch.Tensor]) -> tuple[str | None, str]:
    """(the family whose denoiser a LoRA file's module names belong to, one such key); for a
    file without denoiser modules, SD 1.x/2.x when it has kohya's lora_te_ names (the only
    family with one unnumbered text encoder); None when the names do not tell."""
    keys = sorted(tensors)
    for key in keys:
        for starts, family in _DENOISER_NAMES:
            if key.startswith(starts):
                return family, key.split(".")[0] if key.startswith("lora_") else key
    text = next((k for k in keys if k.startswith(TEXT_ENCODER + "_")), None)
    return ("SD 1.x/2.x", text.split(".")[0]) if text else (None, "")
