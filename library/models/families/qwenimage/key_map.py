"""The key map of Qwen-Image adapter files: written as ``diffusion_model.<diffusers path>``, read
under every name other tools write (library/networks/path_names.py lists them; no Qwen-Image
Linear is fused in another layout, so each name stands for one Linear).

ComfyUI's Qwen-Image model keeps diffusers' module names (its checkpoint is
``model.diffusion_model.`` + the diffusers names), and its LoRA loader maps
``diffusion_model.<path>`` to them; diffusers' QwenImageLoraLoaderMixin reads the same files
(it drops the prefix and turns kohya's tensors into its own). musubi-tuner's
``convert_lora.py --target other`` writes these names too, and its own files
(``networks.lora_qwen_image``) ``lora_unet_<path, _ for .>``.
"""

from __future__ import annotations

from library.networks import path_names
from library.networks.key_maps import AliasedPathNames
from library.networks.path_names import PREFIX, comfy_keys

__all__ = ["NAMES", "comfy_keys", "comfy_model_name", "qwenimage_names"]

# How Qwen-Image files name its Linears, for the shared readers of other tools' layouts.
NAMES = path_names.path_names("Qwen-Image", "transformer_blocks.0.attn.to_q")


def qwenimage_names() -> AliasedPathNames:
    """Qwen-Image's key map."""
    return AliasedPathNames(prefix=PREFIX, names=NAMES)


def comfy_model_name(layer) -> str:
    """The weight of ComfyUI's own Qwen-Image model a Linear of the toolbox's layer table is
    (``layer.parts``: its one diffusers path): ComfyUI keeps diffusers' module names."""
    (path,) = layer.parts
    return path
