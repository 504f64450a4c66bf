"""kohya's block-wise networks.lora options at training set-up: per-block ranks and alphas of
the UNet's adapters, blocks left out, and one parameter group per block learning rate.

The family turns the options into its per-block spec (ModelFamily.blockwise_spec; SD's rules are
library/models/families/sd/blocks.py's); this module applies a spec to the loaded UNet.
"""

from __future__ import annotations

import torch

from library.config.adapter_schema import BLOCKWISE_KEYS
from library.config.schema import Config
from library.errors import ConfigError
from library.models.families.registry import unet_key_layout
from library.networks.kohya_names import UNET, kohya_name, kohya_path
from library.networks.lora import ADAPTER, LoraSpec, apply_lora, lora_layers
from library.networks.targets import TargetKind


def blockwise(config: Config, family):
    """The run's block-wise setting (the family's spec: library.models.families.sd.blocks.
    BlockwiseSpec for SD's UNets), or None when no block-wise key is set. ConfigError for a
    family without kohya's UNet blocks or a value kohya's rules refuse."""
    adapter, net = config.adapter, config.network
    args = {
        key: getattr(adapter, key) for key in BLOCKWISE_KEYS if getattr(adapter, key) is not None
    }
    if not args:
        return None
    try:
        return family.blockwise_spec(
            args,
            dim=net.network_dim,
            alpha=float(net.network_alpha),
            conv_dim=net.conv_dim,
            conv_alpha=net.conv_alpha,
        )
    except ValueError as exc:
        raise ConfigError(f"network_args: {exc}") from None


def _names(denoiser: torch.nn.Module, paths) -> dict[str, str]:
    return {path: kohya_name(UNET, kohya_path(denoiser, path, unet_key_layout)) for path in paths}


def inject_blockwise(
    denoiser: torch.nn.Module,
    targets: dict[str, TargetKind],
    spec,
    lora: LoraSpec,
) -> list[str]:
    """LoRA on the ``targets`` of ``denoiser`` whose block keeps an adapter, each with its
    block's rank and alpha."""
    names = _names(denoiser, targets)
    ranks = {path: spec.rank_alpha(names[path], kind) for path, kind in targets.items()}
    kept = {path: targets[path] for path, rank in ranks.items() if rank is not None}
    if not kept:
        raise ConfigError(
            "network_args: the block-wise settings leave no UNet layer with an adapter (every "
            "block has rank 0 or lr weight 0)"
        )
    return apply_lora(denoiser, kept, lora, {p: ranks[p] for p in kept})


def block_groups(denoiser: torch.nn.Module, spec, lr: float, ratio: float | None) -> list[dict]:
    """One parameter group per block learning rate (``unet_block<N>``, lr x the block's
    weight; with LoRA+ the up weights in a second group at lr x weight x ratio), as kohya
    groups them. Without lr weights: one UNet group."""
    layers = lora_layers(denoiser)
    names = _names(denoiser, layers)
    blocks: dict[int | None, tuple[list, list]] = {}
    for path, layer in layers.items():
        index = spec.block(names[path]) if spec.lr_weights is not None else None
        down, up = blocks.setdefault(index, ([], []))
        down += [p for p in layer.lora_A[ADAPTER].parameters() if p.requires_grad]
        up += [p for p in layer.lora_B[ADAPTER].parameters() if p.requires_grad]
    groups = []
    for index in sorted(blocks, key=lambda i: -1 if i is None else i):
        down, up = blocks[index]
        name = "unet" if index is None else f"unet_block{index}"
        rate = lr * (1.0 if index is None else spec.lr_weights[index])
        if ratio is None:
            groups.append({"params": down + up, "lr": rate, "name": name})
        else:
            groups.append({"params": down, "lr": rate, "name": name})
            groups.append({"params": up, "lr": rate * ratio, "name": f"{name}_up"})
    return groups
