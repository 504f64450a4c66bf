"""Which Linears of a Z-Image transformer a LoRA adapts by default.

The default is musubi-tuner's (``networks.lora_zimage``): every Linear of the joint blocks
(``layers.<i>``, class ``ZImageTransformerBlock``) except their timestep modulation, i.e. per
block ``attention.to_q``, ``to_k``, ``to_v``, ``to_out.0`` and ``feed_forward.w1``, ``w2``,
``w3`` (7 x 30 = 210 Linears in the released model). musubi-tuner excludes the adaLN modulation
and the two refiner stacks by name; ai-toolkit adapts the joint blocks' modulation as well
(``modulation=True`` gives its set). The blocks are found by class in the module tree, so the
same rule holds for the tiny test model and for any layer count.
"""

from __future__ import annotations

from torch import nn

from library.networks.fused_keys import linears_inside
from library.networks.kohya_names import unwrap
from library.networks.targets import TargetKind

BLOCK_CLASS = "ZImageTransformerBlock"  # diffusers' (and musubi-tuner's) block class
JOINT = "layers"  # image + caption blocks
REFINERS = ("noise_refiner", "context_refiner")  # per-stream blocks before the joint ones
MODULATION = "adaLN_modulation"  # timestep -> scale/gate Linear (absent in context_refiner)


def linear_paths(transformer: nn.Module) -> list[str]:
    """Paths of every Linear of the transformer (a peft-wrapped Linear counts as its base)."""
    return linears_inside(unwrap(transformer))


def block_paths(transformer: nn.Module, *, refiners: bool = False) -> list[str]:
    """Paths of the transformer's blocks: the joint ones, and with ``refiners`` the refiners'."""
    groups = (JOINT, *REFINERS) if refiners else (JOINT,)
    return [
        path
        for path, module in unwrap(transformer).named_modules()
        if type(module).__name__ == BLOCK_CLASS and path.split(".", 1)[0] in groups
    ]


def default_targets(
    transformer: nn.Module, *, modulation: bool = False, refiners: bool = False
) -> dict[str, TargetKind]:
    """Map module path -> "linear" for the Linears a default Z-Image LoRA adapts, sorted.

    musubi-tuner's set by default; ``modulation`` adds each block's ``adaLN_modulation.0``
    (ai-toolkit's set), ``refiners`` the noise and context refiner blocks too. Works on a model
    on the meta device and on one already given adapters.
    """
    transformer = unwrap(transformer)
    targets: dict[str, TargetKind] = {}
    for block in block_paths(transformer, refiners=refiners):
        for sub in linears_inside(transformer.get_submodule(block)):
            if modulation or not sub.startswith(MODULATION + "."):
                targets[f"{block}.{sub}"] = "linear"
    if not targets:
        raise ValueError(f"no {BLOCK_CLASS} blocks found in {type(transformer).__name__}")
    return dict(sorted(targets.items()))
