"""Decide what is trained: adapters injected into the models (LoRA) or the whole denoiser."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import torch

from library.config.schema import Config
from library.errors import ConfigError
from library.models.components import Components
from library.models.conditioning import freeze_unused_text_adapters
from library.models.families.family_choice import check_network_module
from library.models.float8 import store_in_float8
from library.models.quantized_base import PRECISIONS, quantize_linears
from library.networks.adapters import STATE_BUFFERS, adapter_parameters
from library.networks.kohya_names import UNET
from library.networks.lora import lora_parameter_split
from library.networks.network_weights import import_network_weights, read_network_file
from library.training.adapter_setup import (
    adapter_settings,
    inject,
    loraplus_refusal,
    trains_text_encoders,
)
from library.training.block_swap import swap_linears
from library.training.blockwise_setup import block_groups, blockwise, inject_blockwise
from library.training.experts import (
    check_expert_config,
    check_file_expert,
    expert_module_name,
    expert_ranges,
)
from library.training.offloaded_checkpoint import offloaded_checkpoint

log = logging.getLogger(__name__)


@dataclass
class TrainedParts:
    """The loaded models plus which of them train and with which parameter groups."""

    components: Components
    lora: bool
    train_unet: bool
    train_text_encoder: bool
    param_groups: list[dict]
    # the denoiser experts that train, by name (library.models.experts), in place of the one
    # denoiser; empty for a model with one
    experts: dict[str, torch.nn.Module] = field(default_factory=dict)

    def trained_modules(self) -> list[tuple[str, torch.nn.Module]]:
        out = []
        if self.train_unet and self.experts:
            out.extend((expert_module_name(n), m) for n, m in self.experts.items())
        elif self.train_unet:
            out.append(("unet", self.components.denoiser))
        if self.train_text_encoder:
            family = self.components.family
            out.extend(e for i, e in enumerate(self.text_encoders()) if family.trains_text_encoder(i))
        return out

    def text_encoders(self) -> list[tuple[str, torch.nn.Module]]:
        """(name, encoder) of every text encoder; names are the family's subfolders
        ("text_encoder", and "text_encoder_2" for SDXL)."""
        names = self.components.family.text_encoder_subfolders
        return list(zip(names, self.components.text_encoders, strict=True))

    def lora_models(self, expert: str | None = None) -> dict[str, torch.nn.Module]:
        """kohya prefix -> model, for the models that carry an adapter; with experts, those of
        one file: ``expert``'s denoiser under the denoiser's prefix (unset: every expert, each
        under its module name, for what counts or scales adapters without writing them)."""
        family = self.components.family
        prefixes = {"unet": UNET}
        prefixes.update(
            zip(family.text_encoder_subfolders, family.text_encoder_lora_prefixes, strict=True)
        )
        for name in self.experts:
            prefixes[expert_module_name(name)] = UNET if name == expert else expert_module_name(name)
        models = {prefixes[name]: module for name, module in self.trained_modules()}
        if expert is not None:
            models = {k: m for k, m in models.items() if k not in map(expert_module_name, self.experts)}
        return models

    def trained_weights(self) -> dict[str, torch.Tensor]:
        """Every trained parameter by "<model>.<parameter path>", and the adapter buffers that
        training changes (STATE_BUFFERS): what a state must keep."""
        weights = {
            f"{name}.{key}": param
            for name, module in self.trained_modules()
            for key, param in module.named_parameters()
            if param.requires_grad
        }
        for name, module in self.trained_modules():
            for key, buffer in module.named_buffers():
                if key.rpartition(".")[2] in STATE_BUFFERS:
                    weights[f"{name}.{key}"] = buffer
        return weights

    def parameters(self) -> list[torch.nn.Parameter]:
        return [p for group in self.param_groups for p in group["params"]]


def denoisers(components: Components) -> tuple[torch.nn.Module, ...]:
    """Every denoiser of the model: its experts, or its one denoiser."""
    experts = components.experts
    return tuple(experts.modules.values()) if experts is not None else (components.denoiser,)


def trained_denoisers(config: Config, components: Components) -> dict[str, torch.nn.Module]:
    """The denoiser modules that train, by trained-module name."""
    if components.experts is None:
        return {"unet": components.denoiser}
    ranges = expert_ranges(config, components.experts)
    return {expert_module_name(n): components.experts.modules[n] for n in ranges}


def setup_training(config: Config, components: Components) -> TrainedParts:
    """Inject adapters or unfreeze the denoiser, load network_weights, build parameter groups."""
    check_network_module(components.family, config.network.network_module)
    components.family.check_training(config)
    check_expert_config(config, components.experts)
    if components.experts is not None:
        # one expert trains: it is the denoiser validation, sampling and the estimate see
        trained = list(expert_ranges(config, components.experts))
        if len(trained) == 1:
            components.denoiser = components.experts.modules[trained[0]]
    for denoiser in denoisers(components):
        components.family.prepare_denoiser(denoiser, config)
    _base_quantized(config, components)
    _base_in_float8(config, components)
    net, lr = config.network, config.optimizer.learning_rate
    unet_lr = net.unet_lr if net.unet_lr is not None else lr
    te_lrs = text_encoder_rates(net.text_encoder_lr, lr, len(components.text_encoders))
    if net.train_mode == "unet":
        groups = []
        for name, unet in trained_denoisers(config, components).items():
            unet.to(trained_dtype(config)).requires_grad_(True)
            groups.append({"params": list(unet.parameters()), "lr": unet_lr, "name": name})
        parts = TrainedParts(components, False, True, False, groups, _experts(config, components))
    else:
        parts = _setup_lora(config, components, unet_lr, te_lrs)
        for param in parts.parameters():  # peft makes adapters float32
            param.data = param.data.to(trained_dtype(config))
    _memory_options(config, parts)
    for _, module in parts.trained_modules():
        _without_dropout(module)
    return parts


def _without_dropout(module: torch.nn.Module) -> None:
    """Switch off the base model's dropout in a module that trains (T5-XXL's config has 0.1;
    SD's and CLIP's are 0): training mode must not draw from the global generator, or results
    would depend on batching, processes and resumes (library.training.noise)."""
    for layer in module.modules():
        if isinstance(layer, torch.nn.Dropout):
            layer.p = 0.0


# The dtype of frozen weights and of autocast under each mixed_precision.
WEIGHT_DTYPES = {"no": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


def trained_dtype(config: Config) -> torch.dtype:
    """The dtype of trained weights: float32, or half precision with full_bf16 / full_fp16."""
    training = config.training
    if training.full_bf16:
        return torch.bfloat16
    if training.full_fp16:
        return torch.float16
    return torch.float32


def _base_quantized(config: Config, components: Components) -> None:
    """base_model_precision: the denoiser's frozen Linear weights in nf4 or int8, before
    adapters wrap them (library.models.quantized_base). The config refuses it with a full
    fine-tune (Config._check_frozen_storage)."""
    training = config.training
    precision = PRECISIONS[training.base_model_precision]
    if precision is None:
        return
    compute = WEIGHT_DTYPES[training.mixed_precision]
    for denoiser in denoisers(components):
        quantize_linears(denoiser, precision, training.bnb_4bit_use_double_quant, compute)


def _base_in_float8(config: Config, components: Components) -> None:
    """fp8_base / fp8_base_unet: the frozen base weights in float8, before adapters wrap them."""
    training = config.training
    if not (training.fp8_base or training.fp8_base_unet):
        return
    compute = WEIGHT_DTYPES[training.mixed_precision]
    modules = list(denoisers(components))
    if training.fp8_base and not training.fp8_base_unet:
        modules += list(components.text_encoders)
    for module in modules:
        store_in_float8(module, compute)


def _refuse_loraplus(config: Config, what: str) -> None:
    opt = config.optimizer
    ratios = ("loraplus_lr_ratio", "loraplus_unet_lr_ratio", "loraplus_text_encoder_lr_ratio")
    for key in ratios:
        if getattr(opt, key) is not None:
            raise ConfigError(f"{key} is for LoRA up/down weights; with {what} remove it")


def text_encoder_rates(rates: float | list[float] | None, lr: float, count: int) -> list[float]:
    """One learning rate per text encoder from text_encoder_lr (a number or kohya's list)."""
    if rates is None:
        return [lr] * count
    if not isinstance(rates, list):
        return [rates] * count
    if len(rates) > count:
        # sd-scripts uses the first rates and ignores the rest (the kohya_ss GUI writes two rates
        # for SD 1.5's one encoder), so a file written for it must load; say so when they differ
        extra = rates[count:]
        if any(rate != rates[count - 1] for rate in extra):
            log.warning(
                "text_encoder_lr has %d rates but the model has %d text encoder%s: %s not used",
                len(rates), count, "s" if count > 1 else "", ", ".join(f"{r:g}" for r in extra),
            )  # fmt: skip
        rates = rates[:count]
    return [rates[min(i, len(rates) - 1)] for i in range(count)]


def _setup_lora(config: Config, components: Components, unet_lr: float, te_lrs: list[float]) -> TrainedParts:
    net = config.network
    settings = adapter_settings(config)
    train_unet = not net.network_train_text_encoder_only
    family = components.family
    trained = [family.trains_text_encoder(i) for i in range(len(family.text_encoder_subfolders))]
    train_te = not net.network_train_unet_only and trains_text_encoders(settings) and any(trained)
    if not (train_unet or train_te):
        raise ConfigError(
            f"preset = {settings.preset} adapts no text encoder and network_train_text_encoder_only "
            "leaves out the UNet: nothing would train; change one of them"
        )
    groups = []
    opt = config.optimizer
    refusal = loraplus_refusal(settings)
    if refusal is not None:
        _refuse_loraplus(config, refusal)
    blocks = blockwise(config, family)
    if train_unet:
        ratio = opt.loraplus_unet_lr_ratio or opt.loraplus_lr_ratio
        for name, denoiser in trained_denoisers(config, components).items():
            if blocks is None:
                inject(family, denoiser, "unet", settings)
                groups += _lora_groups(denoiser, name, unet_lr, ratio)
            else:
                targets = family.adapter_targets(denoiser, "unet", blocks.conv)
                inject_blockwise(denoiser, targets, blocks, settings.lora)
                groups += block_groups(denoiser, blocks, unet_lr, ratio)
    if train_te:
        ratio = opt.loraplus_text_encoder_lr_ratio or opt.loraplus_lr_ratio
        names = family.text_encoder_subfolders
        for encoder, trains in zip(components.text_encoders, trained, strict=True):
            if trains:
                inject(family, encoder, "text_encoder", settings)
        # Layers after the one that conditions the UNet get no gradient, which DDP refuses.
        freeze_unused_text_adapters(
            components.family, components.text_encoders, config.model.clip_skip
        )
        for name, encoder, te_lr, trains in zip(names, components.text_encoders, te_lrs, trained, strict=True):
            if trains:
                groups += _lora_groups(encoder, name, te_lr, ratio)
    parts = TrainedParts(components, True, train_unet, train_te, groups, _experts(config, components))
    if net.network_weights:
        tensors, metadata = read_network_file(family, net.network_weights)
        expert = next(iter(parts.experts), None)  # one at most: check_expert_config
        check_file_expert(metadata, expert, net.network_weights)
        import_network_weights(
            family, parts.lora_models(expert), tensors, net.network_weights, metadata
        )
    return parts


def _experts(config: Config, components: Components) -> dict[str, torch.nn.Module]:
    """The experts that train, by expert name ({} for a model with one denoiser)."""
    if components.experts is None:
        return {}
    return {n: components.experts.modules[n] for n in expert_ranges(config, components.experts)}


def _lora_groups(model: torch.nn.Module, name: str, lr: float, ratio: float | None) -> list[dict]:
    """One group; with LoRA+ the down (A) weights at lr and the up (B) weights at lr * ratio."""
    if ratio is None:
        trained = [p for p in adapter_parameters(model) if p.requires_grad]
        return [{"params": trained, "lr": lr, "name": name}]
    down, up = lora_parameter_split(model)
    return [
        {"params": down, "lr": lr, "name": name},
        {"params": up, "lr": lr * ratio, "name": f"{name}_up"},
    ]


def _memory_options(config: Config, parts: TrainedParts) -> None:
    for denoiser in denoisers(parts.components):
        _denoiser_memory_options(config, parts, denoiser)
    if parts.train_text_encoder and config.training.gradient_checkpointing:
        for encoder in parts.components.text_encoders:
            encoder.activation_checkpointing_enable()


def _denoiser_memory_options(config: Config, parts: TrainedParts, denoiser: torch.nn.Module) -> None:
    trains = parts.train_unet or parts.train_text_encoder
    if config.training.gradient_checkpointing and trains:
        if config.training.cpu_offload_checkpointing:
            denoiser.enable_gradient_checkpointing(offloaded_checkpoint)
        else:
            denoiser.enable_gradient_checkpointing()
    if not uses_sdpa(config):
        parts.components.family.use_plain_attention(denoiser)
    if config.training.blocks_to_swap:
        # blocks_to_swap: the frozen Linears of the transformer's last blocks to host memory
        swap_linears(parts.components.family.swap_blocks(denoiser, config.training.blocks_to_swap))


def uses_sdpa(config: Config) -> bool:
    """Scaled-dot-product attention runs unless every attention switch is off (kohya's plain
    attention); xformers and mem_eff_attn are served by it."""
    training = config.training
    return training.sdpa or training.xformers or training.mem_eff_attn


def allow_fp16_gradients(scaler) -> None:
    """Let the fp16 loss scaler unscale float16 gradients (full_fp16).

    torch's GradScaler refuses float16 gradients because unscaling them can underflow; with
    full_fp16 they are float16 by request, and the scaler's inf/NaN check still guards each step.
    """
    if scaler is None:  # no loss scaler on this device: nothing to unscale
        return
    unscale = scaler._unscale_grads_
    scaler._unscale_grads_ = lambda optimizer, inv_scale, found_inf, _allow: unscale(
        optimizer, inv_scale, found_inf, True
    )
