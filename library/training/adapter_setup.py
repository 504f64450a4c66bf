"""The run's adapter, from the config: kohya's LoRA or a LyCORIS algorithm, and its targets."""

from __future__ import annotations

import torch

from library.config.adapter_schema import lycoris_spec
from library.config.schema import Config
from library.errors import ConfigError
from library.networks.adapters import AdapterSettings, inject_adapters
from library.networks.lora import LoraSpec
from library.networks.lycoris_targets import PRESETS
from library.networks.lycoris_targets import trains_text_encoders as preset_trains


def adapter_settings(config: Config) -> AdapterSettings:
    """The adapter ``config`` asks for; ConfigError naming the network_args key of a value
    LyCORIS would refuse."""
    net, adapter = config.network, config.adapter
    lora = LoraSpec(net.network_dim, net.network_alpha, net.conv_dim, net.conv_alpha)
    if net.network_module != "lycoris.kohya":
        return AdapterSettings(lora)
    try:
        spec = lycoris_spec(config)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    return AdapterSettings(lora, spec, adapter.preset or "full")


def trains_text_encoders(settings: AdapterSettings) -> bool:
    """Whether the adapter has text-encoder layers at all (LyCORIS' unet-only presets have none)."""
    if not settings.is_lycoris:
        return True
    return preset_trains(settings.preset)


def inject(family, module: torch.nn.Module, role: str, settings: AdapterSettings) -> None:
    """Give ``module`` (the denoiser, role "unet", or a text encoder) the run's adapters: LoRA
    on the family's targets, or LyCORIS on the preset's layers as the family lays them out."""
    if settings.is_lycoris:
        family.apply_lycoris(module, role, settings.lycoris, settings.preset)
        return
    targets = family.adapter_targets(module, role, settings.lora.conv_dim is not None)
    inject_adapters(module, targets, settings)


_ALGO_NAMES = {"lora": "LoCon", "locon": "LoCon", "loha": "LoHa", "lokr": "LoKr"}


def adapter_name(config: Config) -> str:
    """The run's adapter in a few words: "LoRA", "LyCORIS LoHa", "LyCORIS LoKr + DoRA"."""
    adapter = config.adapter
    if config.network.network_module != "lycoris.kohya":
        return "LoRA"
    name = f"LyCORIS {_ALGO_NAMES[adapter.algo or 'lora']}"
    return name + (" + DoRA" if adapter.dora_wd else "")


def adapter_text(config: Config) -> str:
    """One plan line: the adapter, its ranks and scales, and where it goes."""
    net, adapter = config.network, config.adapter
    where = (
        "UNet only"
        if net.network_train_unet_only
        else "text encoders only"
        if net.network_train_text_encoder_only
        else "denoiser and text encoders"
    )
    parts = [f"{adapter_name(config)}, rank {net.network_dim}, alpha {net.network_alpha:g}"]
    if net.network_module == "lycoris.kohya":
        preset = adapter.preset or "full"
        if not preset_trains(preset):
            where = "UNet only"
        if PRESETS[preset].convs:
            conv_dim = net.conv_dim or net.network_dim
            parts.append(
                f"kxk convs rank {conv_dim}, alpha {net.conv_alpha or net.network_alpha:g}"
            )
        options = [
            f"factor {adapter.factor}" if adapter.factor not in (None, -1) else "",
            "both Kronecker halves factored" if adapter.decompose_both else "",
            "full second Kronecker half" if adapter.full_matrix else "",
            "Tucker cores on convs" if adapter.use_tucker else "",
            "trained scalar" if adapter.use_scalar else "",
            "rank-stabilised scale" if adapter.rs_lora else "",
            "DoRA per input channel" if adapter.dora_wd and adapter.wd_on_output is False else "",
        ]
        parts += [o for o in options if o]
        parts.append(f"preset {preset} ({where})")
    else:
        if net.conv_dim is not None:
            parts.append(f"3x3 convs rank {net.conv_dim}, alpha {net.conv_alpha or 1.0:g}")
        if any(getattr(adapter, key) is not None for key in ("block_dims", "conv_block_dims")):
            parts.append("per-block ranks (block_dims)")
        lr_keys = ("down_lr_weight", "mid_lr_weight", "up_lr_weight")
        if any(getattr(adapter, key) is not None for key in lr_keys):
            parts.append("per-block learning rates")
        parts.append(where)
    return "; ".join(parts)
