"""Which layers LyCORIS' presets adapt, reproduced on difftune's models.

LyCORIS (in sd-scripts, ``network_module = "lycoris.kohya"``) adapts every Linear and Conv2d
below a module of a preset's target classes, plus a few layers named outright. A 1x1 conv takes
the linear rank; a kxk conv takes conv_dim, and none is adapted when the preset turns convs
off. The classes are sd-scripts' own model classes; difftune's diffusers models share their
names except the attention class (sd-scripts' ``CrossAttention`` is diffusers' ``Attention``).
The named layers (``conv_in``, ``conv_out``, ``time_embedding.linear_1/2``) exist under those
names only in sd-scripts' SD 1.x/2.x UNet: its SDXL UNet calls them ``input_blocks.0.0`` etc.,
so LyCORIS does not adapt them on SDXL, and neither do we.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn

from library.networks.targets import ModelKind, TargetKind


@dataclass(frozen=True)
class Preset:
    """A LyCORIS preset: target classes of the UNet and text encoder, named UNet layers, and
    whether kxk convs are adapted."""

    unet_classes: tuple[str, ...]
    unet_names: tuple[str, ...]
    text_classes: tuple[str, ...]
    convs: bool


_BLOCKS = ("Transformer2DModel", "ResnetBlock2D", "Downsample2D", "Upsample2D")
_NAMES = ("conv_in", "conv_out", "time_embedding.linear_1", "time_embedding.linear_2")
_TEXT = ("CLIPAttention", "CLIPSdpaAttention", "CLIPMLP")

PRESETS = {
    "full": Preset(_BLOCKS, _NAMES, _TEXT, True),
    "full-lin": Preset(("Transformer2DModel", "ResnetBlock2D"), _NAMES[2:], _TEXT, False),
    "attn-mlp": Preset(("Transformer2DModel",), (), _TEXT, False),
    "attn-only": Preset(("Attention",), (), ("CLIPAttention", "CLIPSdpaAttention"), False),
    "unet-only": Preset(_BLOCKS, _NAMES, (), True),
    "unet-transformer-only": Preset(("Transformer2DModel",), (), (), False),
    "unet-convblock-only": Preset(_BLOCKS[1:], _NAMES[:2], (), True),
}


def trains_text_encoders(preset: str) -> bool:
    """Whether ``preset`` adapts text encoders at all."""
    return bool(PRESETS[preset].text_classes)


def _kind(layer: nn.Module, convs: bool) -> TargetKind | None:
    if isinstance(layer, nn.Linear):
        return "linear"
    if isinstance(layer, nn.Conv2d) and layer.groups == 1:
        if tuple(layer.kernel_size) == (1, 1):
            return "linear"
        return "conv" if convs else None
    return None


def lycoris_targets(
    model: nn.Module, role: ModelKind, preset: str, named_layers: bool
) -> dict[str, TargetKind]:
    """Map module path -> "linear" | "conv" for the layers ``preset`` adapts in ``model``.

    ``named_layers``: the model names conv_in/conv_out/time_embedding as sd-scripts' SD 1.x/2.x
    UNet does (false for SDXL, see the module docstring).
    """
    spec = PRESETS[preset]
    classes = spec.unet_classes if role == "unet" else spec.text_classes
    targets: dict[str, TargetKind] = {}
    for block_path, block in model.named_modules():
        if type(block).__name__ not in classes:
            continue
        for sub_path, layer in block.named_modules():
            kind = _kind(layer, spec.convs)
            if sub_path and kind is not None:
                targets[f"{block_path}.{sub_path}" if block_path else sub_path] = kind
    if role == "unet" and named_layers:
        modules = dict(model.named_modules())
        for name in spec.unet_names:
            kind = _kind(modules[name], spec.convs) if name in modules else None
            if kind is not None:
                targets[name] = kind
    return dict(sorted(targets.items()))
