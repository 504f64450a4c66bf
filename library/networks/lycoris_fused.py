"""LyCORIS adapters on FLUX.1's and SD3's transformers, whose files name the original model's
layers while difftune trains diffusers' model.

LyCORIS (in sd-scripts) adapts the original model's Linears, and some of those are one fused
Linear where diffusers has several (q, k and v; FLUX.1's single blocks' q, k, v and MLP input;
see library/networks/fused_keys.py). A LoHa or LoKr of a fused layer is one weight change over
all its rows, which no set of separate adapters on the parts reproduces. So each kohya module
gets ONE LycorisLayer over a view of its fused weight (:class:`FusedView`, the parts' weights
stacked in the original row order, never stored twice), kept by name in the transformer's
``lycoris_modules`` ModuleDict; each diffusers Linear (or SD3's patch-embedding conv) is
replaced by a :class:`LycorisPart` that adds its rows of that layer's change. The adapters stay
inside the model, so DDP syncs them; the file is the layers' own tensors under their names.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import torch
import torch.nn.functional as F
from torch import nn

from library.errors import CheckpointError
from library.networks.adapted_layers import adapter_layers
from library.networks.fused_keys import KohyaModule
from library.networks.kohya_names import group_modules, unwrap
from library.networks.lycoris.layer import LycorisLayer, layer_kind

MODULES = "lycoris_modules"  # the ModuleDict (kohya name -> LycorisLayer) on the transformer


def _swap_halves(rows: torch.Tensor) -> torch.Tensor:
    half = rows.shape[0] // 2
    return torch.cat([rows[half:], rows[:half]], dim=0)


def _base(module: nn.Module) -> nn.Module:
    return getattr(module, "base_layer", module)


class FusedView(nn.Linear):
    """The original model's Linear that diffusers split into ``parts``: its ``weight`` is theirs,
    stacked (halves swapped back where the original orders them so), built when asked. It owns
    no parameters, so nothing is stored twice and the parts stay the model's own."""

    def __init__(self, parts: list[nn.Linear], swapped: bool):
        nn.Module.__init__(self)  # no weight of its own
        object.__setattr__(self, "_parts", tuple(parts))  # not submodules: the model owns them
        self.in_features = parts[0].in_features
        self.out_features = sum(part.out_features for part in parts)
        self.swapped = swapped

    @property
    def weight(self) -> torch.Tensor:
        # float32: the parts may be stored in float8 (fp8_base), which torch.cat cannot join
        stacked = torch.cat([part.weight.detach().float() for part in self._parts], dim=0)
        return _swap_halves(stacked) if self.swapped else stacked

    @property
    def bias(self) -> None:
        return None


class ConvView(nn.Conv2d):
    """A Conv2d seen by a LycorisLayer without being owned by it (see FusedView)."""

    def __init__(self, conv: nn.Conv2d):
        nn.Module.__init__(self)
        object.__setattr__(self, "_conv", conv)
        for attr in ("in_channels", "out_channels", "kernel_size", "stride", "padding",
                     "dilation", "groups", "padding_mode"):  # fmt: skip
            setattr(self, attr, getattr(conv, attr))

    @property
    def weight(self) -> torch.Tensor:
        return self._conv.weight.detach().float()

    @property
    def bias(self) -> None:
        return None


class LycorisPart(nn.Module):
    """A diffusers layer plus its rows ``[start, stop)`` of a shared LycorisLayer's weight change
    (in diffusers' row order). The shared layer is registered once, in the transformer's
    ``lycoris_modules``; here it is only referenced."""

    def __init__(self, base_layer: nn.Module, shared: nn.Module, rows: tuple[int, int]):
        super().__init__()
        self.base_layer = base_layer
        object.__setattr__(self, "_shared", shared)
        self.rows = rows

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        change = self._shared.weight_change()
        if getattr(self._shared.base_layer, "swapped", False):
            change = _swap_halves(change)  # the original's row order -> diffusers'
        change = change[self.rows[0] : self.rows[1]].to(x.dtype)
        base = self.base_layer
        if isinstance(base, nn.Conv2d):
            extra = F.conv2d(x, change, None, base.stride, base.padding, base.dilation)
        else:
            extra = F.linear(x, change)
        return base(x) + extra

    def extra_repr(self) -> str:
        return f"rows={self.rows}"


def apply_module_lycoris(model: nn.Module, modules: Iterable[KohyaModule], spec) -> list[str]:
    """Freeze ``model`` and give each kohya module one LycorisLayer of ``spec`` over its
    (fused) weight, with a LycorisPart in place of each of its diffusers layers; returns the
    kohya names. Adapter parameters are float32 and the only ones that require grad."""
    model = unwrap(model)
    if adapter_layers(model):
        raise ValueError("model already has an adapter")
    model.requires_grad_(False)
    shared = nn.ModuleDict()
    for module in modules:
        bases = [_base(model.get_submodule(path)) for path in module.parts]
        if len(bases) == 1 and isinstance(bases[0], nn.Conv2d):
            view: nn.Module = ConvView(bases[0])
        else:
            view = FusedView(bases, module.swapped_halves)
        layer = LycorisLayer(view, spec, layer_kind(view))
        layer.to(bases[0].weight.device)
        shared[module.name] = layer
        start = 0
        for path, base in zip(module.parts, bases, strict=True):
            rows = base.weight.shape[0]
            parent_path, _, child = path.rpartition(".")
            parent = model.get_submodule(parent_path) if parent_path else model
            setattr(parent, child, LycorisPart(base, layer, (start, start + rows)))
            start += rows
    if not shared:
        raise ValueError(f"no LyCORIS target layers found in {type(model).__name__}")
    model.add_module(MODULES, shared)
    for layer in shared.values():
        for param in layer.adapter_parameters():
            param.data = param.data.float()
            param.requires_grad_(True)
    return list(shared)


def module_layers(model: nn.Module) -> Mapping[str, nn.Module]:
    """kohya name -> LycorisLayer of a transformer given LyCORIS adapters (empty if none)."""
    return getattr(unwrap(model), MODULES, None) or {}


def export_module_lycoris(model: nn.Module) -> dict[str, torch.Tensor]:
    """The transformer's LyCORIS tensors under kohya's names (``<name>.<suffix>``)."""
    return {
        f"{name}.{suffix}": tensor
        for name, layer in module_layers(model).items()
        for suffix, tensor in layer.file_tensors().items()
    }


def import_module_lycoris(
    model: nn.Module, tensors: Mapping[str, torch.Tensor], source: str
) -> None:
    """Load a file's transformer modules into the LyCORIS layers of the same names; every
    module of either side must be in the other, and everything is checked before anything is
    loaded (CheckpointError naming ``source``)."""
    layers = module_layers(model)
    groups = group_modules(tensors)
    unknown = sorted(set(groups) - set(layers))
    if unknown:
        raise CheckpointError(
            f"{source}: {len(unknown)} modules in the file are not LyCORIS modules of this model "
            f"and preset, e.g. {unknown[0]}; check network_args preset"
        )
    missing = sorted(set(layers) - set(groups))
    if missing:
        raise CheckpointError(
            f"{source}: lacks {len(missing)} of the {len(layers)} LyCORIS modules this preset "
            f"adapts, e.g. {missing[0]}; check network_args preset"
        )
    for name in sorted(groups):
        layers[name].check_file_tensors(groups[name], f"{source}: {name}")
    for name in sorted(groups):
        layers[name].load_file_tensors(groups[name], f"{source}: {name}")
