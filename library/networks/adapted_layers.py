"""Which layers of a model carry one of the built-in adapters (peft LoRA or LycorisLayer).

Below the adapter kinds (library/networks/kinds.py): the LyCORIS injectors, which the LyCORIS
kind is built on, ask it whether a model is adapted already. Everything above the kinds asks
library.networks.adapters.adapter_layers, which covers every registered kind.
"""

from __future__ import annotations

from torch import nn

from library.networks.lora import lora_layers
from library.networks.lycoris.layer import LycorisLayer


def lycoris_layers(model: nn.Module) -> dict[str, nn.Module]:
    """Module path -> LycorisLayer for every LyCORIS-adapted layer of ``model``, in module order."""
    return {path: m for path, m in model.named_modules() if isinstance(m, LycorisLayer)}


def adapter_layers(model: nn.Module) -> dict[str, nn.Module]:
    """Module path -> adapted layer (a peft LoRA layer or a LycorisLayer), in module order."""
    layers = {**lora_layers(model), **lycoris_layers(model)}
    order = {path: index for index, (path, _) in enumerate(model.named_modules())}
    return dict(sorted(layers.items(), key=lambda item: order[item[0]]))
