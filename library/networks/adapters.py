"""The adapter seam: what the trainer, the saver and the key tables ask of an adapted model,
whichever adapter kind it carries.

Each kind is an entry of the registry (library/networks/kinds.py): kohya's LoRA/LoCon (the
default, library/networks/lora_kind.py, peft LoRA layers) and LyCORIS' LoCon/LoHa/LoKr with
optional DoRA (``lycoris.kohya``, library/networks/lycoris_kind.py, our own LycorisLayer). Each
replaces the adapted Linear/Conv2d in place and keeps it as ``base_layer``, so the model's own
forward runs the adapter and DDP syncs its gradients like any other parameter's. The functions
here ask every registered kind, so none of them names one.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from torch import nn

from library.networks.kind_base import AdapterSettings
from library.networks.kinds import adapter_kinds, kind_named
from library.networks.targets import TargetKind

__all__ = [
    "STATE_BUFFERS",
    "AdapterSettings",
    "adapter_layers",
    "adapter_parameters",
    "freeze_adapters",
    "inject_adapters",
    "lycoris_layers",
    "saved_numbers",
]

# Buffers of adapter layers that training changes, so a saved state must keep them: LyCORIS'
# fixed scalar, which max-norm (scale_weight_norms) shrinks in LoCon and LoHa layers.
STATE_BUFFERS = ("scalar",)


def lycoris_layers(model: nn.Module) -> dict[str, nn.Module]:
    """Module path -> LycorisLayer for every LyCORIS-adapted layer of ``model``, in module order."""
    return kind_named("lycoris").layers(model)


def adapter_layers(model: nn.Module) -> dict[str, nn.Module]:
    """Module path -> adapted layer of any kind (a peft LoRA layer, a LycorisLayer), in module
    order."""
    layers = {path: layer for kind in adapter_kinds() for path, layer in kind.layers(model).items()}
    order = {path: index for index, (path, _) in enumerate(model.named_modules())}
    return dict(sorted(layers.items(), key=lambda item: order[item[0]]))


def adapter_parameters(model: nn.Module) -> list[nn.Parameter]:
    """Every adapter parameter of ``model`` (trained or frozen), kind by kind in module order."""
    return [
        param
        for kind in adapter_kinds()
        for layer in kind.layers(model).values()
        for param in kind.layer_parameters(layer)
    ]


def freeze_adapters(model: nn.Module, chosen: Callable[[str], bool]) -> list[str]:
    """Stop training the adapters of the layers whose path ``chosen`` accepts; they stay in the
    model (and in saved files). Returns their paths."""
    frozen = []
    for kind in adapter_kinds():
        for path, layer in kind.layers(model).items():
            if chosen(path):
                kind.freeze(layer)
                frozen.append(path)
    return frozen


def saved_numbers(model: nn.Module) -> int:
    """How many numbers an adapter file stores for ``model``'s adapters."""
    return sum(kind.saved_numbers(model) for kind in adapter_kinds())


def inject_adapters(
    model: nn.Module, targets: Mapping[str, TargetKind], settings: AdapterSettings
) -> list[str]:
    """Freeze ``model`` and give each target layer a fresh adapter of the run's kind; return
    their paths. Every adapter starts as the identity (the model's output is unchanged)."""
    return kind_named(settings.kind).inject_targets(model, targets, settings)
