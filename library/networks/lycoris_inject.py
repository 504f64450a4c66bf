"""Put LyCORIS adapters (library/networks/lycoris/layer.py) into a model in place of its layers."""

from __future__ import annotations

from collections.abc import Mapping

from torch import nn

from library.networks.adapted_layers import adapter_layers
from library.networks.lycoris.layer import LycorisLayer
from library.networks.targets import TargetKind


def apply_lycoris(model: nn.Module, targets: Mapping[str, TargetKind], spec) -> list[str]:
    """Freeze ``model`` and replace each target Linear/Conv2d by a LycorisLayer of ``spec``
    ("linear" targets take network_dim/alpha, "conv" ones conv_dim/conv_alpha); return the
    sorted paths. Adapter parameters are float32 and are the only ones that require grad."""
    if adapter_layers(model):
        raise ValueError("model already has an adapter")
    if not targets:
        raise ValueError(f"no adapter target layers found in {type(model).__name__}")
    model.requires_grad_(False)
    for path in sorted(targets):
        parent_path, _, child = path.rpartition(".")
        parent = model.get_submodule(parent_path) if parent_path else model
        base = getattr(parent, child)
        if not isinstance(base, (nn.Linear, nn.Conv2d)):
            raise ValueError(f"{path} is a {type(base).__name__}, not a Linear or Conv2d")
        layer = LycorisLayer(base, spec, targets[path])
        layer.to(base.weight.device)
        setattr(parent, child, layer)
        for param in layer.adapter_parameters():
            param.data = param.data.float()
            param.requires_grad_(True)
    return sorted(targets)
