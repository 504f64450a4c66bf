"""Module names of Z-Image adapter files (LoRA, LyCORIS) and the Linears they stand for.

difftune writes ``diffusion_model.`` + the diffusers module path, e.g.
``diffusion_model.layers.0.attention.to_q``: the names ai-toolkit writes and musubi-tuner's
``convert_lora.py --target other`` produces, which ComfyUI maps for its Z-Image model
(``comfy.lora.model_lora_keys_unet``, Lumina2 branch, built from ``comfy.utils.
z_image_to_diffusers``: to_q/to_k/to_v become row slices of the original fused
``attention.qkv``) and diffusers' ``ZImageLoraLoaderMixin`` reads after dropping the prefix.
Each diffusers Linear keeps its own module, so q, k and v need no fusing.

Other tools name the same Linears differently; :func:`file_modules` lists every name below,
built from the model's own paths (never by guessing which underscores were dots), and
library/networks/linear_files.py reads files in any of them (``NAMES``):

=========================================  =====================================================
``diffusion_model.<diffusers path>``        difftune, ai-toolkit, musubi-tuner's "other" export
``transformer.<diffusers path>``            diffusers' ``save_lora_weights`` (peft)
``lora_unet_<diffusers path, _ for .>``     musubi-tuner's own files (``networks.lora_zimage``)
``lycoris_<diffusers path, _ for .>``       SimpleTuner / ai-toolkit's old LoKr files
``diffusion_model.<original path>``         ComfyUI's generic names of the original model
``lora_unet_<original path, _ for .>``      kohya's original names (musubi-tuner's
                                            ``convert_z_image_lora_to_comfy.py``)
=========================================  =====================================================

The original names differ from diffusers' where library/models/families/zimage/keys.py says:
``attention.out`` is ``to_out.0``, ``x_embedder`` is ``all_x_embedder.2-1``, ``final_layer.*``
is ``all_final_layer.2-1.*`` and ``attention.qkv`` is ONE module for to_q, to_k and to_v (its
rows in that order).
"""

from __future__ import annotations

from torch import nn

from library.models.families.zimage import keys
from library.models.families.zimage.targets import linear_paths
from library.networks.linear_files import LinearNames

PREFIX = "diffusion_model."  # what difftune writes
PEFT_PREFIX = "transformer."  # diffusers' save_lora_weights
KOHYA_PREFIX = "lora_unet_"  # musubi-tuner / kohya
LYCORIS_PREFIX = "lycoris_"  # SimpleTuner / ai-toolkit old LoKr


def original_module(path: str) -> str:
    """The original model's module holding the diffusers Linear ``path`` (to_q/k/v: ``qkv``)."""
    return keys.original_name(path + ".weight").removesuffix(".weight")


def _underscored(prefix: str, path: str) -> str:
    return prefix + path.replace(".", "_")


def file_modules(transformer: nn.Module) -> dict[str, tuple[str, ...]]:
    """Every module name a Z-Image adapter file may use for ``transformer`` -> the diffusers
    Linears it stands for (three for a fused qkv, in row order q, k, v; else one)."""
    table: dict[str, tuple[str, ...]] = {}

    def add(name: str, parts: tuple[str, ...]) -> None:
        if table.setdefault(name, parts) != parts:  # two Linears would share one file name
            raise ValueError(f"{name} names both {table[name]} and {parts}")

    fused: dict[str, list[str]] = {}
    for path in linear_paths(transformer):
        for name in (
            PREFIX + path,
            PEFT_PREFIX + path,
            _underscored(KOHYA_PREFIX, path),
            _underscored(LYCORIS_PREFIX, path),
        ):
            add(name, (path,))
        original = original_module(path)
        if original != path:
            fused.setdefault(original, []).append(path)
    for original, paths in fused.items():
        order = [p.removesuffix(".weight") for p in keys.diffusers_names(original + ".weight")]
        parts = tuple(p for p in order if p in paths)
        if len(parts) != len(paths):
            raise ValueError(f"{original} stands for {order}, the model has {paths}")
        add(PREFIX + original, parts)
        add(_underscored(KOHYA_PREFIX, original), parts)
    return table


def comfy_model_name(layer) -> str | None:
    """The weight of ComfyUI's own Z-Image model a Linear of the toolbox's layer table is
    (``layer.parts``: its one diffusers path), by which ComfyUI's generic names are made
    (``lora_unet_<name>``, ``diffusion_model.<name>``); None for to_q, to_k and to_v, which
    are row slices of one fused qkv weight there."""
    (path,) = layer.parts
    original = original_module(path)
    return None if len(keys.diffusers_names(original + ".weight")) > 1 else original


def comfy_keys(layer, original: str) -> dict[str, tuple[int, ...] | None]:
    """The further names ComfyUI's loader gives a Linear of its Z-Image model (comfy/lora.py,
    its Lumina2 branch over comfy.utils.z_image_to_diffusers): the diffusers path under
    ``diffusion_model.``, ``transformer.``, ``lycoris_`` (underscored) and bare."""
    (path,) = layer.parts
    names = (PREFIX + path, PEFT_PREFIX + path, _underscored(LYCORIS_PREFIX, path), path)
    return dict.fromkeys(names)


def written_name(path: str) -> str:
    """The module name difftune writes for the diffusers Linear ``path``."""
    return PREFIX + path


# How Z-Image files name its Linears, for the shared readers of other tools' layouts.
NAMES = LinearNames(
    family="Z-Image",
    table=file_modules,
    written=written_name,
    peft_prefix=PEFT_PREFIX,
    examples=f"{PREFIX}layers.0.attention.to_q or {KOHYA_PREFIX}layers_0_attention_to_q",
)
