"""The run's adapter, from the config: the kind its network_module selects (kohya's LoRA, a
LyCORIS algorithm, ...; library/networks/kinds.py), its settings and its targets."""

from __future__ import annotations

import torch

from library.config.schema import Config
from library.networks.adapters import AdapterSettings
from library.networks.kinds import kind_for, kind_named


def adapter_settings(config: Config) -> AdapterSettings:
    """The adapter ``config`` asks for; ConfigError naming the network_args key of a value
    the kind would refuse."""
    return kind_for(config.network.network_module).settings(config)


def trains_text_encoders(settings: AdapterSettings) -> bool:
    """Whether the adapter has text-encoder layers at all (LyCORIS' unet-only presets have none)."""
    return kind_named(settings.kind).trains_text_encoders(settings)


def loraplus_refusal(settings: AdapterSettings) -> str | None:
    """What LoRA+'s refusal calls the run's adapter, or None where LoRA+ applies."""
    return kind_named(settings.kind).loraplus_refusal


def inject(family, module: torch.nn.Module, role: str, settings: AdapterSettings) -> None:
    """Give ``module`` (the denoiser, role "unet", or a text encoder) the run's adapters on the
    layers the family targets for the kind (LoRA: its targets; LyCORIS: the preset's layers as
    the family lays them out)."""
    kind_named(settings.kind).inject(family, module, role, settings)


def adapter_name(config: Config) -> str:
    """The run's adapter in a few words: "LoRA", "LyCORIS LoHa", "LyCORIS LoKr + DoRA"."""
    return kind_for(config.network.network_module).plan_name(config)


def adapter_text(config: Config) -> str:
    """One plan line: the adapter, its ranks and scales, and where it goes."""
    net = config.network
    where = (
        "denoiser only"
        if net.network_train_unet_only
        else "text encoders only"
        if net.network_train_text_encoder_only
        else "denoiser and text encoders"
    )
    parts = [f"{adapter_name(config)}, rank {net.network_dim}, alpha {net.network_alpha:g}"]
    parts += kind_for(net.network_module).plan_parts(config, where)
    return "; ".join(parts)
