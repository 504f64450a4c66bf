"""Helpers for SD3 LoRA tests: tiny SD3Transformer2DModels, the ORIGINAL (Stability AI MMDiT)
layout of their weights, tiny CLIP text encoders, and peft merges.

``to_original`` inverts diffusers' ``convert_sd3_transformer_checkpoint_to_diffusers`` by hand
(from its source in diffusers 0.42.1); ``from_original`` runs the converter itself, so
``from_original(to_original(sd)) == sd`` checks the inverse against diffusers.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

VARIANTS = ("sd3-medium", "sd3.5-medium", "sd3.5-large")


def sd3_config(variant: str) -> dict:
    """SD3Transformer2DModel kwargs of a tiny model of ``variant`` (3 joint blocks, the last one
    pre-only; SD3.5 Medium's block 0 has dual attention; SD3.5 has rms qk norms)."""
    try:
        from tests.kits.sd3.tiny_shapes import tiny_transformer_config
    except ImportError:  # the shapes module is not there: the same layout by hand
        return {
            "sample_size": 8,
            "patch_size": 2,
            "in_channels": 16,
            "num_layers": 3,
            "attention_head_dim": 16,
            "num_attention_heads": 2,
            "joint_attention_dim": 48,
            "caption_projection_dim": 32,
            "pooled_projection_dim": 40,
            "out_channels": 16,
            "pos_embed_max_size": 16,
            "dual_attention_layers": (0,) if variant == "sd3.5-medium" else (),
            "qk_norm": None if variant == "sd3-medium" else "rms_norm",
        }
    return dict(tiny_transformer_config(variant))


def build_sd3(variant: str, seed: int = 0):
    """A tiny SD3Transformer2DModel of ``variant`` with weights drawn under ``seed``; the
    zero-initialised modulation and output layers get noise too, so every weight matters."""
    from diffusers import SD3Transformer2DModel

    torch.manual_seed(seed)
    model = SD3Transformer2DModel(**sd3_config(variant)).eval()
    gen = torch.Generator().manual_seed(seed + 100)
    with torch.no_grad():
        for param in model.parameters():
            param.add_(torch.randn(param.shape, generator=gen) * 0.05)
    return model


def meta_sd3(config: Mapping):
    from diffusers import SD3Transformer2DModel

    with torch.device("meta"):
        return SD3Transformer2DModel(**config)


def _swap(tensor: torch.Tensor) -> torch.Tensor:
    first, second = tensor.chunk(2, dim=0)
    return torch.cat([second, first], dim=0)


def to_original(state: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A diffusers SD3 transformer state dict in the original MMDiT layout (sd3_models.py:
    joint_blocks.{i}.x_block / context_block, fused attn.qkv, adaLN_modulation.1, ...), in
    tensors of its own (changing them leaves the model alone)."""
    s = {key: value.detach().clone() for key, value in state.items()}
    out: dict[str, torch.Tensor] = {"pos_embed": s.pop("pos_embed.pos_embed")}
    plain = {
        "pos_embed.proj": "x_embedder.proj",
        "time_text_embed.timestep_embedder.linear_1": "t_embedder.mlp.0",
        "time_text_embed.timestep_embedder.linear_2": "t_embedder.mlp.2",
        "time_text_embed.text_embedder.linear_1": "y_embedder.mlp.0",
        "time_text_embed.text_embedder.linear_2": "y_embedder.mlp.2",
        "context_embedder": "context_embedder",
        "proj_out": "final_layer.linear",
    }
    for end in ("weight", "bias"):
        for diffusers, original in plain.items():
            out[f"{original}.{end}"] = s.pop(f"{diffusers}.{end}")
        out[f"final_layer.adaLN_modulation.1.{end}"] = _swap(s.pop(f"norm_out.linear.{end}"))
    blocks = sorted({int(k.split(".")[1]) for k in s if k.startswith("transformer_blocks.")})
    for i in blocks:
        d, o = f"transformer_blocks.{i}", f"joint_blocks.{i}"
        last = i == blocks[-1]
        fused = {
            "x_block.attn.qkv": ("attn.to_q", "attn.to_k", "attn.to_v"),
            "context_block.attn.qkv": ("attn.add_q_proj", "attn.add_k_proj", "attn.add_v_proj"),
        }
        single = {
            "x_block.attn.proj": "attn.to_out.0",
            "x_block.adaLN_modulation.1": "norm1.linear",
            "x_block.mlp.fc1": "ff.net.0.proj",
            "x_block.mlp.fc2": "ff.net.2",
        }
        if f"{d}.attn2.to_q.weight" in s:
            fused["x_block.attn2.qkv"] = ("attn2.to_q", "attn2.to_k", "attn2.to_v")
            single["x_block.attn2.proj"] = "attn2.to_out.0"
        if not last:
            single |= {
                "context_block.attn.proj": "attn.to_add_out",
                "context_block.adaLN_modulation.1": "norm1_context.linear",
                "context_block.mlp.fc1": "ff_context.net.0.proj",
                "context_block.mlp.fc2": "ff_context.net.2",
            }
        for end in ("weight", "bias"):
            for original, parts in fused.items():
                out[f"{o}.{original}.{end}"] = torch.cat([s.pop(f"{d}.{p}.{end}") for p in parts])
            for original, part in single.items():
                out[f"{o}.{original}.{end}"] = s.pop(f"{d}.{part}.{end}")
            if last:  # the pre-only context modulation: diffusers keeps (scale, shift)
                out[f"{o}.context_block.adaLN_modulation.1.{end}"] = _swap(
                    s.pop(f"{d}.norm1_context.linear.{end}")
                )
        norms = {
            "x_block.attn.ln_q": "attn.norm_q",
            "x_block.attn.ln_k": "attn.norm_k",
            "context_block.attn.ln_q": "attn.norm_added_q",
            "context_block.attn.ln_k": "attn.norm_added_k",
            "x_block.attn2.ln_q": "attn2.norm_q",
            "x_block.attn2.ln_k": "attn2.norm_k",
        }
        for original, part in norms.items():
            if f"{d}.{part}.weight" in s:
                out[f"{o}.{original}.weight"] = s.pop(f"{d}.{part}.weight")
    assert not s, f"not inverted: {sorted(s)[:5]}"
    return out


def from_original(original: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """diffusers' own conversion of an original-layout state dict, which must use every key."""
    from diffusers.loaders.single_file_utils import (
        convert_sd3_transformer_checkpoint_to_diffusers,
    )

    checkpoint = dict(original)
    converted = convert_sd3_transformer_checkpoint_to_diffusers(checkpoint)
    assert not checkpoint, f"diffusers left {sorted(checkpoint)[:5]}"
    return converted


def build_clip(hidden: int, layers: int, seed: int):
    """A tiny CLIPTextModelWithProjection (SD3's CLIP-L and CLIP-G class)."""
    from transformers import CLIPTextConfig, CLIPTextModelWithProjection

    torch.manual_seed(seed)
    config = CLIPTextConfig(
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=2,
        projection_dim=hidden,
        vocab_size=100,
        bos_token_id=0,
        eos_token_id=2,
        pad_token_id=1,
    )
    return CLIPTextModelWithProjection(config).eval()


@torch.no_grad()
def peft_merged(model) -> dict[str, torch.Tensor]:
    """The weights of ``model`` with every peft adapter merged by peft (``W + scale B A``), by
    the module paths of the unadapted model. ``model`` is left merged."""
    from library.networks.lora import lora_layers

    for layer in lora_layers(model).values():
        layer.merge()
    state = model.state_dict()
    return {
        key.replace(".base_layer.", "."): value
        for key, value in state.items()
        if ".lora_A." not in key and ".lora_B." not in key
    }
