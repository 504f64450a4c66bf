"""Module names of Z-Image adapter files (LoRA, LyCORIS) and the Linears they stand for.

difftune writes ``diffusion_model.`` + the diffusers module path, e.g.
``diffusion_model.layers.0.attention.to_q``: the names ai-toolkit writes and musubi-tuner's
``convert_lora.py --target other`` produces, which ComfyUI maps for its Z-Image model
(``comfy.lora.model_lora_keys_unet``, Lumina2 branch, built from ``comfy.utils.
z_image_to_diffusers``: to_q/to_k/to_v become row slices of the original fused
``attention.qkv``) and diffusers' ``ZImageLoraLoaderMixin`` reads after dropping the prefix.
Each diffusers Linear keeps its own module, so q, k and v need no fusing.

Other tools name the same Linears differently: library/networks/path_names.py lists every name,
built from the model's own paths and Z-Image's name table (keys.py: ``attention.out`` is
``to_out.0``, ``x_embedder`` is ``all_x_embedder.2-1``, ``final_layer.*`` is
``all_final_layer.2-1.*`` and ``attention.qkv`` is ONE module for to_q, to_k and to_v, its rows
in that order), and library/networks/linear_files.py reads files in any of them (``NAMES``).
"""

from __future__ import annotations

from torch import nn

from library.models.families.zimage.keys import TABLE
from library.networks import path_names
from library.networks.path_names import PREFIX, comfy_keys

__all__ = ["NAMES", "PREFIX", "comfy_keys", "comfy_model_name", "file_modules"]


def file_modules(transformer: nn.Module) -> dict[str, tuple[str, ...]]:
    """Every module name a Z-Image adapter file may use for ``transformer`` -> the diffusers
    Linears it stands for (three for a fused qkv, in row order q, k, v; else one)."""
    return path_names.path_modules(transformer, TABLE)


def comfy_model_name(layer) -> str | None:
    """The weight of ComfyUI's own Z-Image model a Linear of the toolbox's layer table is
    (``layer.parts``: its one diffusers path), by which ComfyUI's generic names are made
    (``lora_unet_<name>``, ``diffusion_model.<name>``); None for to_q, to_k and to_v, which
    are row slices of one fused qkv weight there."""
    (path,) = layer.parts
    original = path_names.original_module(TABLE, path)
    return None if len(path_names.fused_parts(TABLE, original)) > 1 else original


# How Z-Image files name its Linears, for the shared readers of other tools' layouts.
NAMES = path_names.path_names("Z-Image", "layers.0.attention.to_q", TABLE)
