"""Adapters of a transformer that trains alone (its text encoders get none, as musubi-tuner's
trainers of the single-caption-encoder families): which Linears a LyCORIS preset adapts, and
the LoRA settings such a transformer refuses.

A family gives its own default target rule, ``targets_of(every_layer)``: the Linears its LoRA
adapts, with its extra layers (the blocks' modulation, extra block stacks) when ``every_layer``.
"""

from __future__ import annotations

from collections.abc import Callable

from library.errors import ConfigError
from library.networks.targets import TargetKind

# LyCORIS presets that adapt something of such a transformer -> whether they adapt every layer
# (full, full-lin, unet-only) or the attention and feed-forward Linears alone.
EVERY_LAYER = {
    "full": True,
    "full-lin": True,
    "unet-only": True,
    "attn-mlp": False,
    "unet-transformer-only": False,
    "attn-only": False,
}


def transformer_only(role: str, label: str) -> None:
    """ConfigError for adapters of anything but the transformer."""
    if role != "unet":
        raise ConfigError(f"{label} LoRAs adapt the transformer only")


def preset_targets(
    label: str,
    role: str,
    preset: str,
    targets_of: Callable[[bool], dict[str, TargetKind]],
    attention: str,
) -> dict[str, TargetKind]:
    """The Linears LyCORIS' ``preset`` adapts: ``targets_of(EVERY_LAYER[preset])``, for
    attn-only only the paths holding ``attention`` (the blocks' attention module); ConfigError
    for the text encoders and presets that adapt nothing here."""
    if role != "unet" or preset not in EVERY_LAYER:
        raise ConfigError(
            f"preset = {preset}: adapts no layer of {label}'s transformer; use full, "
            "full-lin or attn-mlp"
        )
    targets = targets_of(EVERY_LAYER[preset])
    if preset == "attn-only":
        targets = {p: k for p, k in targets.items() if attention in p}
    return targets


def check_lora(config, label: str) -> None:
    """ConfigError for a conv rank of a LoRA (LyCORIS' is ignored: GUIs always write it) of a
    transformer without convolutions."""
    net = config.network
    lycoris = net.network_module == "lycoris.kohya"
    if net.train_mode == "lora" and net.conv_dim is not None and not lycoris:
        raise ConfigError(f"conv_dim: {label}'s transformer has no convolutions; remove it")
