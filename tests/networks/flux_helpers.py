"""Helpers for Flux LoRA tests: small FluxTransformer2DModels, inputs, and a merge by hand."""

from __future__ import annotations

import logging
import warnings
from collections.abc import Callable, Mapping

import torch

# A small transformer with every kind of block: two double and two single blocks.
TINY = {
    "patch_size": 1,
    "in_channels": 64,
    "num_layers": 2,
    "num_single_layers": 2,
    "attention_head_dim": 16,
    "num_attention_heads": 2,
    "joint_attention_dim": 32,
    "pooled_projection_dim": 32,
    "guidance_embeds": False,
    "axes_dims_rope": (4, 6, 6),
}
# FLUX.1-dev's transformer config (black-forest-labs/FLUX.1-dev, transformer/config.json).
DEV = {
    "patch_size": 1,
    "in_channels": 64,
    "num_layers": 19,
    "num_single_layers": 38,
    "attention_head_dim": 128,
    "num_attention_heads": 24,
    "joint_attention_dim": 4096,
    "pooled_projection_dim": 768,
    "guidance_embeds": True,
    "axes_dims_rope": (16, 56, 56),
}
# One single block at Flux.1's width (3072, MLP 12288) and nothing else that is wide but the
# embedders: diffusers splits linear1 with Flux.1's sizes written into its converter.
WIDE_SINGLE = dict(
    DEV, num_layers=0, num_single_layers=1, joint_attention_dim=32, pooled_projection_dim=32
)
WIDE_SINGLE["guidance_embeds"] = False


def build_flux(config: Mapping, seed: int = 0):
    """A FluxTransformer2DModel with weights drawn under ``seed``, in eval mode."""
    from diffusers import FluxTransformer2DModel

    torch.manual_seed(seed)
    return FluxTransformer2DModel(**config).eval()


def flux_inputs(
    config: Mapping, seed: int = 1, image_tokens: int = 16, text_tokens: int = 8
) -> dict[str, torch.Tensor]:
    """Forward arguments for a batch of one."""
    gen = torch.Generator().manual_seed(seed)
    width = config["joint_attention_dim"]
    inputs = {
        "hidden_states": torch.randn(1, image_tokens, config["in_channels"], generator=gen),
        "encoder_hidden_states": torch.randn(1, text_tokens, width, generator=gen),
        "pooled_projections": torch.randn(1, config["pooled_projection_dim"], generator=gen),
        "timestep": torch.tensor([0.7]),
        "img_ids": torch.randn(image_tokens, 3, generator=gen),
        "txt_ids": torch.zeros(text_tokens, 3),
    }
    if config.get("guidance_embeds"):
        inputs["guidance"] = torch.tensor([3.5])
    return inputs


def run_flux(model, inputs: Mapping[str, torch.Tensor]) -> torch.Tensor:
    with torch.no_grad():
        return model(**inputs).sample


@torch.no_grad()
def merge_by_hand(model, weights: Mapping[str, tuple[torch.Tensor, torch.Tensor, float]]) -> None:
    """``W += alpha / r * up @ down`` for every (down, up, alpha) of ``weights``, in place."""
    for path, (down, up, alpha) in weights.items():
        linear = model.get_submodule(path)
        linear.weight += alpha / down.shape[0] * (up.float() @ down.float())


def capture_diffusers_warnings(call: Callable[[], object]) -> tuple[object, list[str]]:
    """``call()``'s result and every warning diffusers logged or raised while it ran."""
    from diffusers.utils import logging as diffusers_logging

    messages: list[str] = []

    class _Capture(logging.Handler):
        def emit(self, record):
            messages.append(record.getMessage())

    logger = diffusers_logging.get_logger("diffusers")
    handler, level = _Capture(logging.WARNING), logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.WARNING)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            result = call()
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
    return result, messages + [str(w.message) for w in caught]


def adapt(model, paths: list[str], rank: int, alpha: float) -> None:
    """Give ``model`` peft LoRA adapters on ``paths`` (the project's adapter name), frozen base."""
    from peft import LoraConfig, inject_adapter_in_model

    from library.networks.lora import ADAPTER

    config = LoraConfig(r=rank, lora_alpha=alpha, target_modules=paths, lora_dropout=0.0)
    model.requires_grad_(False)
    inject_adapter_in_model(config, model, adapter_name=ADAPTER)
