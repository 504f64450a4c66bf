"""kohya's LoRA/LoCon as an adapter kind: peft LoRA layers (library/networks/lora.py), and the
file tensors of one module: ``lora_down.weight`` [r, in], ``lora_up.weight`` [out, r] and a 0-d
float32 ``alpha`` (scale alpha / r). A module standing for several layers (an original model's
fused layer) stacks their downs and puts their ups on a block diagonal
(library/networks/fused_keys.py).
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import nn

from library.errors import CheckpointError
from library.networks import fused_keys
from library.networks.kind_base import AdapterKind, AdapterSettings, FileModule
from library.networks.kohya_names import ALPHA, DOWN, UP
from library.networks.lora import (
    ADAPTER,
    LoraSpec,
    apply_lora,
    lora_layers,
    lora_rank,
    saved_numbers,
)


class LoraKind(AdapterKind):
    """The default kind: every network_module no other kind names (networks.lora and the
    families' kohya variants)."""

    name = "lora"

    def settings(self, config) -> AdapterSettings:
        net = config.network
        lora = LoraSpec(net.network_dim, net.network_alpha, net.conv_dim, net.conv_alpha)
        return AdapterSettings(lora, kind=self.name)

    def plan_name(self, config) -> str:
        return "LoRA"

    def plan_parts(self, config, where: str) -> list[str]:
        net, adapter = config.network, config.adapter
        parts = []
        if net.conv_dim is not None:
            parts.append(f"3x3 convs rank {net.conv_dim}, alpha {net.conv_alpha or 1.0:g}")
        if any(getattr(adapter, key) is not None for key in ("block_dims", "conv_block_dims")):
            parts.append("per-block ranks (block_dims)")
        lr_keys = ("down_lr_weight", "mid_lr_weight", "up_lr_weight")
        if any(getattr(adapter, key) is not None for key in lr_keys):
            parts.append("per-block learning rates")
        parts.append(where)
        return parts

    def inject_targets(self, model, targets, settings):
        return apply_lora(model, targets, settings.lora)

    def layers(self, model):
        return lora_layers(model)

    def layer_parameters(self, layer):
        return [*layer.lora_A[ADAPTER].parameters(), *layer.lora_B[ADAPTER].parameters()]

    def saved_numbers(self, model):
        return saved_numbers(model)

    # -- files -------------------------------------------------------------------------------

    def module_layer(self, file_layers, module: FileModule):
        """The adapters of ``module``'s layers (a list, one per part), None when none has one;
        ValueError when only some have (a fused module is written whole or not at all)."""
        layers = [file_layers.get(path) for path in module.parts]
        if all(layer is None for layer in layers):
            return None
        if any(layer is None for layer in layers):
            missing = [p for p, layer in zip(module.parts, layers, strict=True) if layer is None]
            raise ValueError(
                f"{module.name} fuses {', '.join(module.parts)}; all or none of them must be "
                f"adapted, but {', '.join(missing)} are not"
            )
        return layers

    def module_tensors(self, file_layers, module: FileModule):
        """A plain module: its layer's down, up and alpha; a module with a key table's shapes
        (fused_keys.KohyaModule): its parts' adapters fused (stacked downs, block-diagonal up)."""
        layers = self.module_layer(file_layers, module)
        if layers is None:
            return None
        weights = {path: _weights(layer) for path, layer in zip(module.parts, layers, strict=True)}
        if isinstance(module, fused_keys.KohyaModule):
            fused = fused_keys.export_lora([module], weights)
            return {key.removeprefix(module.name + "."): t for key, t in fused.items()}
        if len(layers) != 1 or module.swapped_halves:
            raise ValueError(f"{module.name}: a fused LoRA module needs the key table's shapes")
        down, up, alpha = weights[module.parts[0]]
        return {
            DOWN: down.clone(),
            UP: up.clone(),
            ALPHA: torch.tensor(alpha, dtype=torch.float32),
        }

    def group_tensors(self, tensors, source):
        """kohya's LoRA suffixes only: another key is a CheckpointError naming it."""
        groups: dict[str, dict[str, torch.Tensor]] = {}
        for key, tensor in tensors.items():
            name, _, kind = key.partition(".")
            if kind not in (DOWN, UP, ALPHA):
                raise CheckpointError(
                    f"{source}: unexpected key {key!r} (not a kohya LoRA/LoCon tensor)"
                )
            groups.setdefault(name, {})[kind] = tensor
        return groups

    def check_layer(self, layer, tensors, where):
        _checked(layer, tensors, where)

    @torch.no_grad()
    def load_layer(self, layer, tensors, where):
        down, up, alpha = _checked(layer, tensors, where)
        for weight, value in ((layer.lora_A[ADAPTER].weight, down), (layer.lora_B[ADAPTER].weight, up)):  # fmt: skip
            weight.copy_(value.to(weight.device, weight.dtype))
        layer.lora_alpha[ADAPTER] = float(alpha)
        layer.scaling[ADAPTER] = float(alpha) / layer.r[ADAPTER]

    def load_original_modules(self, model, modules, tensors, source):
        """kohya's fused modules split back into their parts' adapters (fused_keys)."""
        weights = fused_keys.import_lora(modules, tensors, source)
        fused_keys.load_adapter_weights(model, weights, source)


def _weights(layer: nn.Module) -> fused_keys.LoraWeights:
    return (
        layer.lora_A[ADAPTER].weight.detach(),
        layer.lora_B[ADAPTER].weight.detach(),
        float(layer.lora_alpha[ADAPTER]),
    )


def _checked(
    layer: nn.Module, parts: Mapping[str, torch.Tensor], where: str
) -> tuple[torch.Tensor, torch.Tensor, float]:
    """(down, up, alpha) of one module, shaped for ``layer``; alpha = rank when absent."""
    for kind in (DOWN, UP):
        if kind not in parts:
            raise CheckpointError(f"{where} has no {kind} tensor")
    down = parts[DOWN]
    rank = lora_rank(layer)
    if down.shape[0] != rank:
        rank_key = "conv_dim" if down.dim() == 4 and down.shape[-1] > 1 else "network_dim"
        raise CheckpointError(
            f"{where} has rank {down.shape[0]} but the configured rank is {rank}; "
            f"set {rank_key} = {down.shape[0]}"
        )
    fitted = []
    for kind, target in ((DOWN, layer.lora_A[ADAPTER]), (UP, layer.lora_B[ADAPTER])):
        tensor = _fit(parts[kind], target.weight.shape)
        if tensor is None:
            raise CheckpointError(
                f"{where}.{kind} has shape {list(parts[kind].shape)}, the model needs "
                f"{list(target.weight.shape)}; the file was made for a different base model"
            )
        fitted.append(tensor)
    alpha = float(parts[ALPHA].float().item()) if ALPHA in parts else float(rank)
    return fitted[0], fitted[1], alpha


def _fit(tensor: torch.Tensor, shape: torch.Size) -> torch.Tensor | None:
    """``tensor`` in ``shape``, allowing only [r, in] <-> [r, in, 1, 1] (Linear vs 1x1 conv)."""
    if tensor.shape == shape:
        return tensor
    # Same leading [out|r, in|r] and same element count: the rest are all size-1 dims.
    if tensor.shape[:2] == shape[:2] and tensor.numel() == shape.numel():
        return tensor.reshape(shape)
    return None


LORA = LoraKind()
