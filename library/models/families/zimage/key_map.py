"""The key map of Z-Image adapter files: written as ``diffusion_model.<diffusers path>``, read
under every name lora_keys.py lists (library/networks/linear_files.py reads other tools'
layouts: aliases, a fused qkv, alphas a peft header gives)."""

from __future__ import annotations

from library.models.families.zimage import lora_keys
from library.networks.key_maps import AliasedPathNames


def zimage_names() -> AliasedPathNames:
    """Z-Image's key map."""
    return AliasedPathNames(prefix=lora_keys.PREFIX, names=lora_keys.NAMES)
