"""LoRA adapters injected into the model with peft: difftune's LoRA/LoCon adapter.

Code outside library/networks reaches the adapter only through these functions (inject, the
trained parameters and their LoRA+ split, freezing, the numbers a file stores), never through
peft's ``lora_A``/``lora_B`` attributes, so another adapter kind can stand beside this one.

Each adapted layer is replaced in place by a peft LoRA layer that keeps the original as
``base_layer``; the model's own forward therefore runs the adapter, and a DDP wrapper around the
model syncs adapter gradients like any other parameter. The scale is kohya's ``alpha / rank``
(peft's ``lora_alpha / r`` with rsLoRA off).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import torch
from torch import nn

from library.networks.targets import ModelKind, TargetKind, default_targets

ADAPTER = "default"  # peft adapter name; one adapter per model


@dataclass(frozen=True)
class LoraSpec:
    """Rank and alpha of Linear/1x1 layers and (LoCon) of 3x3 convs; no conv_dim = no conv LoRA."""

    dim: int
    alpha: float
    conv_dim: int | None = None
    conv_alpha: float | None = None

    def __post_init__(self) -> None:
        if self.dim < 1 or (self.conv_dim is not None and self.conv_dim < 1):
            raise ValueError(
                f"LoRA ranks must be >= 1, got dim={self.dim} conv_dim={self.conv_dim}"
            )
        if self.alpha <= 0 or (self.conv_alpha is not None and self.conv_alpha <= 0):
            raise ValueError(f"LoRA alphas must be > 0, got {self.alpha} / {self.conv_alpha}")

    @property
    def effective_conv_alpha(self) -> float | None:
        """conv_alpha, defaulting to 1 (scale 1 / conv_dim) as kohya's networks.lora does."""
        if self.conv_dim is None:
            return None
        return float(self.conv_alpha) if self.conv_alpha is not None else 1.0


def lora_layers(model: nn.Module) -> dict[str, nn.Module]:
    """Module path -> peft LoRA layer for every adapted layer of ``model``, in module order."""
    from peft.tuners.lora import LoraLayer

    return {
        path: module
        for path, module in model.named_modules()
        if isinstance(module, LoraLayer) and ADAPTER in module.lora_A
    }


def apply_lora(
    model: nn.Module,
    targets: ModelKind | Mapping[str, TargetKind],
    spec: LoraSpec,
    ranks: Mapping[str, tuple[int, float]] | None = None,
) -> list[str]:
    """Freeze ``model`` and inject a fresh LoRA into ``targets``; return their paths.

    ``targets`` maps module path -> "linear" | "conv" (a family's adapter_targets), or names a
    role ("unet", "text_encoder") whose SD/CLIP default targets are taken. Down weights start Kaiming-uniform and up weights at zero (peft's default), so the model's
    output is unchanged until training moves them. Adapter parameters are float32 and are the
    only parameters that require grad. ``ranks`` gives some paths their own (rank, alpha)
    (kohya's block-wise block_dims / block_alphas); the others take ``spec``'s.
    """
    from peft import LoraConfig, inject_adapter_in_model

    if lora_layers(model):
        raise ValueError("model already has a LoRA adapter")
    if isinstance(targets, str):
        targets = default_targets(model, targets, conv=spec.conv_dim is not None)
    if not targets:
        raise ValueError(f"no LoRA target layers found in {type(model).__name__}")
    ranks = ranks or {}
    wanted = {
        path: ranks[path] if path in ranks else _rank_alpha(spec, kind)
        for path, kind in targets.items()
    }
    own = {p: ra for p, ra in wanted.items() if ra != (spec.dim, float(spec.alpha))}
    # rank/alpha patterns are regexes matched against the full path: anchored, dots escaped.
    config = LoraConfig(
        r=spec.dim,
        lora_alpha=float(spec.alpha),
        target_modules=sorted(targets),
        rank_pattern={f"^{re.escape(p)}$": rank for p, (rank, _) in own.items()},
        alpha_pattern={f"^{re.escape(p)}$": alpha for p, (_, alpha) in own.items()},
        lora_dropout=0.0,
        bias="none",
        use_rslora=False,
        init_lora_weights=True,
    )
    model.requires_grad_(False)
    inject_adapter_in_model(config, model, adapter_name=ADAPTER)
    adapted = lora_layers(model)
    if sorted(adapted) != sorted(targets):
        missing = sorted(set(targets) - set(adapted))
        raise RuntimeError(f"peft did not adapt {len(missing)} target layers, e.g. {missing[:3]}")
    for path, layer in adapted.items():
        _check_scale(path, layer, *wanted[path])
    for param in lora_parameters(model):
        param.data = param.data.float()
        param.requires_grad_(True)
    return sorted(adapted)


def _rank_alpha(spec: LoraSpec, kind: str) -> tuple[int, float]:
    """(rank, alpha) ``spec`` gives a layer of ``kind``."""
    if kind == "conv":
        return spec.conv_dim, float(spec.effective_conv_alpha)
    return spec.dim, float(spec.alpha)


def _check_scale(path: str, layer: nn.Module, rank: int, alpha: float) -> None:
    """peft must scale exactly by kohya's alpha / rank (no rsLoRA, right pattern applied)."""
    if layer.r[ADAPTER] != rank or layer.scaling[ADAPTER] != alpha / rank:
        raise RuntimeError(
            f"peft configured {path} with r={layer.r[ADAPTER]} scaling={layer.scaling[ADAPTER]}, "
            f"expected r={rank} scaling={alpha / rank}"
        )


def lora_parameters(model: nn.Module) -> list[nn.Parameter]:
    """The adapter's down and up weights, in module order (down before up)."""
    params: list[nn.Parameter] = []
    for layer in lora_layers(model).values():
        params.extend(layer.lora_A[ADAPTER].parameters())
        params.extend(layer.lora_B[ADAPTER].parameters())
    return params


def lora_parameter_split(model: nn.Module) -> tuple[list[nn.Parameter], list[nn.Parameter]]:
    """(down weights, up weights) that train, in module order: LoRA+'s two learning rates."""
    layers = lora_layers(model).values()
    down = [p for layer in layers for p in layer.lora_A[ADAPTER].parameters() if p.requires_grad]
    up = [p for layer in layers for p in layer.lora_B[ADAPTER].parameters() if p.requires_grad]
    return down, up


def freeze_adapters(model: nn.Module, chosen: Callable[[str], bool]) -> list[str]:
    """Stop training the adapters of the layers whose path ``chosen`` accepts; they stay in the
    model (and in saved files). Returns their paths."""
    frozen = []
    for path, layer in lora_layers(model).items():
        if chosen(path):
            for module in (layer.lora_A[ADAPTER], layer.lora_B[ADAPTER]):
                module.requires_grad_(False)
            frozen.append(path)
    return frozen


def saved_numbers(model: nn.Module) -> int:
    """How many numbers a LoRA file stores for ``model``'s adapter: each layer's down and up
    weights and its alpha."""
    return sum(p.numel() for p in lora_parameters(model)) + len(lora_layers(model))


def lora_rank(layer: nn.Module) -> int:
    return int(layer.r[ADAPTER])


def lora_alpha(layer: nn.Module) -> float:
    return float(layer.lora_alpha[ADAPTER])


def set_lora_scale(model: nn.Module, path_to_alpha: Mapping[str, float]) -> None:
    """Set the alpha (and so the scale alpha / rank) of the adapted layers named in the map."""
    layers = lora_layers(model)
    unknown = sorted(set(path_to_alpha) - set(layers))
    if unknown:
        raise KeyError(f"not an adapted layer: {unknown[0]}")
    for path, alpha in path_to_alpha.items():
        layer = layers[path]
        layer.lora_alpha[ADAPTER] = float(alpha)
        layer.scaling[ADAPTER] = float(alpha) / layer.r[ADAPTER]


@torch.no_grad()
def randomize_lora(model: nn.Module, generator: torch.Generator, std: float = 0.02) -> None:
    """Fill every adapter weight with normal noise (tests and tools: a non-trivial adapter)."""
    for param in lora_parameters(model):
        noise = torch.randn(param.shape, generator=generator, dtype=torch.float32) * std
        param.copy_(noise.to(param.device, param.dtype))
