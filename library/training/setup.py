"""Decide what is trained: adapters injected into the models (LoRA) or the whole UNet."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from library.config.schema import Config
from library.models.loader import Components
from library.networks.kohya_keys import TEXT_ENCODER, UNET, import_lora
from library.networks.lora import LoraSpec, apply_lora, lora_parameters
from library.saving.lora_file import read_lora_file


@dataclass
class TrainedParts:
    """The loaded models plus which of them train and with which parameter groups."""

    components: Components
    lora: bool
    train_unet: bool
    train_text_encoder: bool
    param_groups: list[dict]

    def trained_modules(self) -> list[tuple[str, torch.nn.Module]]:
        out = []
        if self.train_unet:
            out.append(("unet", self.components.unet))
        if self.train_text_encoder:
            out.append(("text_encoder", self.components.text_encoder))
        return out

    def lora_models(self) -> dict[str, torch.nn.Module]:
        """kohya prefix -> model, for the models that carry an adapter."""
        prefixes = {"unet": UNET, "text_encoder": TEXT_ENCODER}
        return {prefixes[name]: module for name, module in self.trained_modules()}

    def trained_weights(self) -> dict[str, torch.Tensor]:
        """Every trained parameter by "<model>.<parameter path>": what a state must keep."""
        return {
            f"{name}.{key}": param
            for name, module in self.trained_modules()
            for key, param in module.named_parameters()
            if param.requires_grad
        }

    def parameters(self) -> list[torch.nn.Parameter]:
        return [p for group in self.param_groups for p in group["params"]]


def setup_training(config: Config, components: Components) -> TrainedParts:
    """Inject adapters or unfreeze the UNet, load network_weights, build parameter groups."""
    net, lr = config.network, config.optimizer.learning_rate
    unet_lr = net.unet_lr if net.unet_lr is not None else lr
    te_lr = net.text_encoder_lr if net.text_encoder_lr is not None else lr
    if net.train_mode == "unet":
        unet = components.unet.to(torch.float32).requires_grad_(True)
        parts = TrainedParts(components, False, True, False, [{"params": list(unet.parameters()), "lr": unet_lr, "name": "unet"}])
    else:
        parts = _setup_lora(config, components, unet_lr, te_lr)
    _memory_options(config, parts)
    return parts


def _setup_lora(config: Config, components: Components, unet_lr: float, te_lr: float) -> TrainedParts:
    net = config.network
    spec = LoraSpec(net.network_dim, net.network_alpha, net.conv_dim, net.conv_alpha)
    train_unet = not net.network_train_text_encoder_only
    train_te = not net.network_train_unet_only
    groups = []
    if train_unet:
        apply_lora(components.unet, "unet", spec)
        groups.append({"params": lora_parameters(components.unet), "lr": unet_lr, "name": "unet"})
    if train_te:
        apply_lora(components.text_encoder, "text_encoder", spec)
        groups.append({"params": lora_parameters(components.text_encoder), "lr": te_lr, "name": "text_encoder"})
    parts = TrainedParts(components, True, train_unet, train_te, groups)
    if net.network_weights:
        tensors, _ = read_lora_file(net.network_weights)
        import_lora(parts.lora_models(), tensors, net.network_weights)
    return parts


def _memory_options(config: Config, parts: TrainedParts) -> None:
    unet, text_encoder = parts.components.unet, parts.components.text_encoder
    if config.training.gradient_checkpointing:
        if parts.train_unet or parts.train_text_encoder:
            unet.enable_gradient_checkpointing()
        if parts.train_text_encoder:
            text_encoder.gradient_checkpointing_enable()
    if not config.training.sdpa:
        from diffusers.models.attention_processor import AttnProcessor

        unet.set_attn_processor(AttnProcessor())
