"""Which layers of an SD UNet or CLIP text encoder a default (kohya-compatible) LoRA adapts.

Layers are chosen by the class of the block that contains them, not by name patterns, so the same
rule gives SD 1.5's 192 UNet modules and CLIP-L's 72 text-encoder modules as well as the
corresponding subsets of the tiny test models.
"""

from __future__ import annotations

from typing import Literal

from torch import nn

ModelKind = Literal["unet", "text_encoder"]
TargetKind = Literal["linear", "conv"]


def _unet_block_classes() -> tuple[tuple[type, ...], tuple[type, ...]]:
    """(attention containers, conv containers) of diffusers' UNet."""
    from diffusers.models.downsampling import Downsample2D
    from diffusers.models.resnet import ResnetBlock2D
    from diffusers.models.transformers.transformer_2d import Transformer2DModel
    from diffusers.models.upsampling import Upsample2D

    return (Transformer2DModel,), (ResnetBlock2D, Downsample2D, Upsample2D)


def _text_block_classes() -> tuple[type, ...]:
    """Self-attention and MLP blocks of transformers' CLIP text encoder."""
    from transformers.models.clip.modeling_clip import CLIPMLP, CLIPAttention

    return (CLIPAttention, CLIPMLP)


def _is_pointwise(layer: nn.Module) -> bool:
    """Linear layers and 1x1 convolutions share the linear rank (they are both a matmul)."""
    if isinstance(layer, nn.Linear):
        return True
    return isinstance(layer, nn.Conv2d) and tuple(layer.kernel_size) == (1, 1)


def _layers_inside(model: nn.Module, containers: tuple[type, ...]) -> list[tuple[str, nn.Module]]:
    """(path, layer) of every Linear/Conv2d below a module of one of ``containers``."""
    found: list[tuple[str, nn.Module]] = []
    for block_path, block in model.named_modules():
        if not isinstance(block, containers):
            continue
        for sub_path, layer in block.named_modules():
            if sub_path and isinstance(layer, (nn.Linear, nn.Conv2d)):
                found.append((f"{block_path}.{sub_path}" if block_path else sub_path, layer))
    return found


def default_targets(model: nn.Module, kind: ModelKind, conv: bool) -> dict[str, TargetKind]:
    """Map module path -> "linear" | "conv" for the layers a default LoRA adapts.

    UNet: every Linear and 1x1 Conv2d inside each Transformer2DModel; with ``conv`` also the
    layers of ResNet blocks, down- and upsamplers (3x3 convs -> "conv", which take the conv
    rank; Linear and 1x1 convs there -> "linear"). Text encoder: every Linear of CLIP's
    self-attention and MLP blocks (q/k/v/out_proj, fc1, fc2); ``conv`` does not apply.
    """
    targets: dict[str, TargetKind] = {}
    if kind == "text_encoder":
        for path, _ in _layers_inside(model, _text_block_classes()):
            targets[path] = "linear"
        return dict(sorted(targets.items()))
    if kind != "unet":
        raise ValueError(f"unknown model kind {kind!r}; expected 'unet' or 'text_encoder'")
    attention, conv_blocks = _unet_block_classes()
    for path, layer in _layers_inside(model, attention):
        # A 3x3 conv inside an attention block is not part of a (Lo)RA-by-default layer set.
        if _is_pointwise(layer):
            targets[path] = "linear"
    if conv:
        for path, layer in _layers_inside(model, conv_blocks):
            targets[path] = "linear" if _is_pointwise(layer) else "conv"
    return dict(sorted(targets.items()))
