"""The key map of Qwen-Image adapter files: written as ``diffusion_model.<diffusers path>``, read
under every name other tools write.

ComfyUI's Qwen-Image model keeps diffusers' module names (its checkpoint is
``model.diffusion_model.`` + the diffusers names), and its LoRA loader maps
``diffusion_model.<path>`` to them; diffusers' QwenImageLoraLoaderMixin reads the same files
(it drops the prefix and turns kohya's tensors into its own). musubi-tuner's
``convert_lora.py --target other`` writes these names too. So a file holds
``diffusion_model.<path>`` + kohya's LoRA tensors per Linear (a LyCORIS file its kind's tensors
under the same module names).

Other tools name the same Linears (every name is built from the model's own paths, never by
guessing which underscores were dots), and library/networks/linear_files.py reads them all:

=========================================  ==================================================
``diffusion_model.<path>``                  difftune, musubi-tuner's "other" export, ai-toolkit
``transformer.<path>``                      diffusers' ``save_lora_weights`` (peft)
``lora_unet_<path, _ for .>``               musubi-tuner's own files (``networks.lora_qwen_image``)
``lycoris_<path, _ for .>``                 SimpleTuner's LyCORIS files
=========================================  ==================================================

No Qwen-Image Linear is fused in another layout, so each name stands for one Linear.
"""

from __future__ import annotations

from torch import nn

from library.networks.fused_keys import linears_inside
from library.networks.key_maps import AliasedPathNames
from library.networks.kohya_names import unwrap
from library.networks.linear_files import LinearNames

PREFIX = "diffusion_model."  # what difftune writes
PEFT_PREFIX = "transformer."  # diffusers' save_lora_weights
KOHYA_PREFIX = "lora_unet_"  # musubi-tuner
LYCORIS_PREFIX = "lycoris_"  # SimpleTuner


def file_modules(transformer: nn.Module) -> dict[str, tuple[str, ...]]:
    """Every module name a Qwen-Image adapter file may use for ``transformer`` -> the one
    diffusers Linear it stands for."""
    table: dict[str, tuple[str, ...]] = {}
    for path in linears_inside(unwrap(transformer)):
        underscored = path.replace(".", "_")
        for name in (PREFIX + path, PEFT_PREFIX + path, KOHYA_PREFIX + underscored,
                     LYCORIS_PREFIX + underscored):  # fmt: skip
            if table.setdefault(name, (path,)) != (path,):
                raise ValueError(f"{name} names both {table[name]} and {path}")
    return table


# How Qwen-Image files name its Linears, for the shared readers of other tools' layouts.
NAMES = LinearNames(
    family="Qwen-Image",
    table=file_modules,
    written=lambda path: PREFIX + path,
    peft_prefix=PEFT_PREFIX,
    examples=f"{PREFIX}transformer_blocks.0.attn.to_q or {KOHYA_PREFIX}transformer_blocks_0_attn_to_q",
)


def qwenimage_names() -> AliasedPathNames:
    """Qwen-Image's key map."""
    return AliasedPathNames(prefix=PREFIX, names=NAMES)


def comfy_model_name(layer) -> str:
    """The weight of ComfyUI's own Qwen-Image model a Linear of the toolbox's layer table is
    (``layer.parts``: its one diffusers path): ComfyUI keeps diffusers' module names."""
    (path,) = layer.parts
    return path


def comfy_keys(layer, original: str) -> dict[str, tuple[int, ...] | None]:
    """The further names ComfyUI's loader gives a Linear of its Qwen-Image model (comfy/lora.py,
    its Qwen-Image branch): the diffusers path under ``diffusion_model.``, ``transformer.``,
    ``lycoris_`` (underscored) and bare."""
    (path,) = layer.parts
    names = (PREFIX + path, PEFT_PREFIX + path, LYCORIS_PREFIX + path.replace(".", "_"), path)
    return dict.fromkeys(names)
