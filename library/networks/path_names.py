"""The adapter-file names of a transformer whose files name its Linears by diffusers paths (the
layout diffusers, ComfyUI and musubi-tuner's "other" export share), built from the model's own
paths and, where the original model fuses some of them, from its name table
(library/models/families/name_table.py).

=========================================  =====================================================
``diffusion_model.<diffusers path>``        difftune, ai-toolkit, musubi-tuner's "other" export
``transformer.<diffusers path>``            diffusers' ``save_lora_weights`` (peft)
``lora_unet_<diffusers path, _ for .>``     musubi-tuner's own files
``lycoris_<diffusers path, _ for .>``       SimpleTuner / ai-toolkit's old LoKr files
``diffusion_model.<original path>``         ComfyUI's generic names of the original model
``lora_unet_<original path, _ for .>``      kohya's original names
``<head><original path>``                   further heads a family names (ai-toolkit's
                                            ``base_model.model.``)
=========================================  =====================================================

The original names exist only for Linears the name table renames; a module the original fuses
(``attention.qkv``) stands for its diffusers parts in row order. A family whose original names
are one per Linear may write them (``writes_original``: Krea 2, whose readers in diffusers take
only those) instead of ``diffusion_model.<diffusers path>``. Names are never guessed back
from underscores: every one is made from a path the model has.
"""

from __future__ import annotations

from torch import nn

from library.networks.fused_keys import linears_inside
from library.networks.kohya_names import unwrap
from library.networks.linear_files import LinearNames

PREFIX = "diffusion_model."  # what difftune writes
PEFT_PREFIX = "transformer."  # diffusers' save_lora_weights
KOHYA_PREFIX = "lora_unet_"  # musubi-tuner / kohya
LYCORIS_PREFIX = "lycoris_"  # SimpleTuner / ai-toolkit old LoKr


def underscored(prefix: str, path: str) -> str:
    return prefix + path.replace(".", "_")


def original_module(table, path: str) -> str:
    """The original model's module holding the diffusers Linear ``path`` (``table``: a name
    table; None: the same path)."""
    if table is None:
        return path
    return table.original_key(path + ".weight").removesuffix(".weight")


def fused_parts(table, original: str) -> tuple[str, ...]:
    """The diffusers Linears an original module stands for, in row order."""
    return tuple(k.removesuffix(".weight") for k in table.diffusers_keys(original + ".weight"))


def path_modules(
    transformer: nn.Module, table=None, heads: tuple[str, ...] = ()
) -> dict[str, tuple[str, ...]]:
    """Every module name an adapter file may use for ``transformer`` (module docstring;
    ``heads``: further prefixes of the original names) -> the diffusers Linears it stands for
    (a fused module's parts in row order; else one)."""
    modules: dict[str, tuple[str, ...]] = {}

    def add(name: str, parts: tuple[str, ...]) -> None:
        if modules.setdefault(name, parts) != parts:  # two Linears would share one file name
            raise ValueError(f"{name} names both {modules[name]} and {parts}")

    fused: dict[str, list[str]] = {}
    for path in linears_inside(unwrap(transformer)):
        for name in (PREFIX + path, PEFT_PREFIX + path, underscored(KOHYA_PREFIX, path),
                     underscored(LYCORIS_PREFIX, path)):  # fmt: skip
            add(name, (path,))
        original = original_module(table, path)
        if original != path:
            fused.setdefault(original, []).append(path)
        for head in heads:
            add(head + original, (path,))
    for original, paths in fused.items():
        parts = tuple(p for p in fused_parts(table, original) if p in paths)
        if len(parts) != len(paths):
            raise ValueError(
                f"{original} stands for {fused_parts(table, original)}, the model has {paths}"
            )
        add(PREFIX + original, parts)
        add(underscored(KOHYA_PREFIX, original), parts)
    return modules


def path_names(
    family: str, example: str, table=None, heads: tuple[str, ...] = (),
    writes_original: bool = False,
) -> LinearNames:  # fmt: skip
    """How the files of ``family`` name its Linears (``example``: one diffusers Linear path, for
    messages), for the shared readers of other tools' layouts; written as
    ``diffusion_model.<diffusers path>``, or ``<original path>`` with ``writes_original``."""
    written = (lambda path: original_module(table, path)) if writes_original else str
    return LinearNames(
        family=family,
        table=lambda transformer: path_modules(transformer, table, heads),
        written=lambda path: PREFIX + written(path),
        peft_prefix=PEFT_PREFIX,
        examples=f"{PREFIX}{written(example)} or {underscored(KOHYA_PREFIX, example)}",
    )


def comfy_keys(layer, original: str) -> dict[str, tuple[int, ...] | None]:
    """The further names ComfyUI's loader gives a Linear of the toolbox's layer table
    (``layer.parts``: its one diffusers path): the diffusers path under ``diffusion_model.``,
    ``transformer.``, ``lycoris_`` (underscored) and bare."""
    (path,) = layer.parts
    names = (PREFIX + path, PEFT_PREFIX + path, underscored(LYCORIS_PREFIX, path), path)
    return dict.fromkeys(names)
