"""The adapter seam: what the trainer, the saver and the key tables ask of an adapted model,
whichever adapter kind it carries.

Two kinds exist: kohya's LoRA/LoCon (``networks.lora`` and the FLUX.1/SD3 variants), injected as
peft LoRA layers by library/networks/lora.py, and LyCORIS' LoCon/LoHa/LoKr with optional DoRA
(``lycoris.kohya``), injected as our own LycorisLayer (library/networks/lycoris/). Both replace
the adapted Linear/Conv2d in place and keep it as ``base_layer``, so the model's own forward runs
the adapter and DDP syncs its gradients like any other parameter's.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from torch import nn

from library.networks.adapted_layers import adapter_layers, lycoris_layers
from library.networks.lora import LoraSpec, apply_lora, lora_parameters
from library.networks.lora import saved_numbers as lora_numbers
from library.networks.lycoris_inject import apply_lycoris
from library.networks.targets import TargetKind

# Buffers of adapter layers that training changes, so a saved state must keep them: LyCORIS'
# fixed scalar, which max-norm (scale_weight_norms) shrinks in LoCon and LoHa layers.
STATE_BUFFERS = ("scalar",)


def adapter_parameters(model: nn.Module) -> list[nn.Parameter]:
    """Every adapter parameter of ``model`` (trained or frozen), in module order."""
    params = list(lora_parameters(model))
    for layer in lycoris_layers(model).values():
        params.extend(layer.adapter_parameters())
    return params


def freeze_adapters(model: nn.Module, chosen: Callable[[str], bool]) -> list[str]:
    """Stop training the adapters of the layers whose path ``chosen`` accepts; they stay in the
    model (and in saved files). Returns their paths."""
    frozen = []
    for path, layer in adapter_layers(model).items():
        if chosen(path):
            params = (
                layer.adapter_parameters()
                if path in lycoris_layers(model)
                else [*layer.lora_A.parameters(), *layer.lora_B.parameters()]
            )
            for param in params:
                param.requires_grad_(False)
            frozen.append(path)
    return frozen


def saved_numbers(model: nn.Module) -> int:
    """How many numbers an adapter file stores for ``model``'s adapters."""
    return lora_numbers(model) + sum(
        layer.saved_numbers() for layer in lycoris_layers(model).values()
    )


@dataclass(frozen=True)
class AdapterSettings:
    """One run's adapter: kohya's LoRA (``lycoris`` None) or a LyCORIS algorithm.

    ``lora`` holds the ranks and alphas the LoRA path uses; ``lycoris`` a
    library.networks.lycoris.spec.LycorisSpec, and ``preset`` LyCORIS' layer preset.
    """

    lora: LoraSpec
    lycoris: object | None = None
    preset: str = "full"

    @property
    def is_lycoris(self) -> bool:
        return self.lycoris is not None


def inject_adapters(
    model: nn.Module, targets: Mapping[str, TargetKind], settings: AdapterSettings
) -> list[str]:
    """Freeze ``model`` and give each target layer a fresh adapter of the run's kind; return
    their paths. Every adapter starts as the identity (the model's output is unchanged)."""
    if not settings.is_lycoris:
        return apply_lora(model, targets, settings.lora)
    return apply_lycoris(model, targets, settings.lycoris)
