"""Component configs read off a checkpoint's tensor shapes, for non-standard architectures.

A released SD 1.x/2.x/SDXL checkpoint fits the configs shipped in library/models/configs. A file
with other sizes (a pruned research model, the tiny test models) gets a config derived here:
channels, depths, levels with attention, context width, projection kind, text-encoder sizes
follow from the shapes. Two things do not show in any shape and keep the family config's value
or a fitting guess: attention head counts and GroupNorm group counts (a warning says so).
"""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Mapping

log = logging.getLogger(__name__)

Shapes = Mapping[str, tuple[int, ...]]


def _indices(shapes: Shapes, pattern: str) -> list[int]:
    """Sorted distinct integers captured by ``pattern`` (one group) over the keys."""
    rx = re.compile(pattern)
    return sorted({int(m.group(1)) for k in shapes if (m := rx.match(k))})


def _groups(channels: list[int], preferred: int) -> int:
    """The family's group count when it divides every width, else the largest that does."""
    if all(c % preferred == 0 for c in channels):
        return preferred
    return math.gcd(preferred, *channels)


def _heads(width: int, preferred: int) -> int:
    """A head count for ``width``: the family's, else 64-wide heads, else the largest of 8..1."""
    for heads in (preferred, width // 64, 8, 4, 2, 1):
        if heads > 0 and width % heads == 0:
            return heads
    return 1


def _per_level(value, levels: int) -> list:
    return list(value)[:levels] if isinstance(value, (list, tuple)) else [value] * levels


def unet_config_from_shapes(shapes: Shapes, base: dict, pooled_dim: int | None = None) -> dict:
    """A UNet2DConditionModel config for original-layout UNet keys (no file prefix).

    ``base`` is the family's shipped config (non-derivable fields come from it); ``pooled_dim``
    is the pooled text width of SDXL-style size conditioning (the second encoder's projection).
    """
    ops = _indices(shapes, r"input_blocks\.(\d+)\.0\.op\.weight")
    blocks = _indices(shapes, r"input_blocks\.(\d+)\.")
    # Level boundaries are the downsamplers: resnets of level L sit between op L-1 and op L.
    bounds = [0, *ops, max(blocks) + 1]
    levels = [
        [b for b in blocks if lo < b < hi] for lo, hi in zip(bounds, bounds[1:], strict=False)
    ]
    per_block = len(levels[0])
    channels = [shapes[f"input_blocks.{lv[0]}.0.in_layers.2.weight"][0] for lv in levels]
    attention, depth = [], []
    for lv in levels:
        found = _indices(shapes, rf"input_blocks\.{lv[0]}\.1\.transformer_blocks\.(\d+)\.")
        attention.append(bool(found))
        depth.append(len(found) or 1)
    n = len(levels)
    up_attention = [
        bool(
            _indices(shapes, rf"output_blocks\.{u * (per_block + 1)}\.1\.transformer_blocks\.(\d+)")
        )
        for u in range(n)
    ]
    context = next(v[1] for k, v in shapes.items() if k.endswith("attn2.to_k.weight"))
    proj = next(v for k, v in shapes.items() if k.endswith(".proj_in.weight"))
    base_heads = _per_level(base.get("attention_head_dim", 8), len(base["block_out_channels"]))
    heads = [_heads(c, base_heads[min(i, len(base_heads) - 1)]) for i, c in enumerate(channels)]
    config = {
        **base,
        "in_channels": shapes["input_blocks.0.0.weight"][1],
        "out_channels": shapes["out.2.weight"][0],
        "block_out_channels": channels,
        "layers_per_block": per_block,
        "down_block_types": ["CrossAttnDownBlock2D" if a else "DownBlock2D" for a in attention],
        "up_block_types": ["CrossAttnUpBlock2D" if a else "UpBlock2D" for a in up_attention],
        "cross_attention_dim": context,
        "use_linear_projection": len(proj) == 2,
        "attention_head_dim": heads if len(set(heads)) > 1 else heads[0],
        "transformer_layers_per_block": depth if len(set(depth)) > 1 else depth[0],
        "norm_num_groups": _groups(channels, base.get("norm_num_groups", 32)),
    }
    time_dim = shapes["time_embed.0.weight"][0]
    if time_dim != channels[0] * 4:
        config["time_embedding_dim"] = time_dim
    if "label_emb.0.0.weight" in shapes:
        label_in = shapes["label_emb.0.0.weight"][1]
        config["projection_class_embeddings_input_dim"] = label_in
        if pooled_dim is not None and (label_in - pooled_dim) % 6 == 0:
            config["addition_time_embed_dim"] = (label_in - pooled_dim) // 6
    for key in ("addition_embed_type", "projection_class_embeddings_input_dim"):
        if key in config and "label_emb.0.0.weight" not in shapes:
            config.pop(key)
    return config


def vae_config_from_shapes(shapes: Shapes, base: dict) -> dict:
    """An AutoencoderKL config for original-layout VAE keys (no file prefix)."""
    levels = _indices(shapes, r"encoder\.down\.(\d+)\.")
    channels = [shapes[f"encoder.down.{lv}.block.0.conv1.weight"][0] for lv in levels]
    per_block = len(_indices(shapes, r"encoder\.down\.0\.block\.(\d+)\."))
    return {
        **base,
        "in_channels": shapes["encoder.conv_in.weight"][1],
        "out_channels": shapes["decoder.conv_out.weight"][0],
        "block_out_channels": channels,
        "down_block_types": ["DownEncoderBlock2D"] * len(channels),
        "up_block_types": ["UpDecoderBlock2D"] * len(channels),
        "layers_per_block": per_block,
        "latent_channels": shapes["post_quant_conv.weight"][0],
        "norm_num_groups": _groups(channels, base.get("norm_num_groups", 32)),
    }


def text_config_from_shapes(shapes: Shapes, base: dict) -> dict:
    """A CLIPTextConfig dict for transformers CLIP keys in the ``text_model.`` layout."""
    vocab, width = shapes["text_model.embeddings.token_embedding.weight"]
    config = {
        **base,
        "vocab_size": vocab,
        "hidden_size": width,
        "max_position_embeddings": shapes["text_model.embeddings.position_embedding.weight"][0],
        "num_hidden_layers": len(_indices(shapes, r"text_model\.encoder\.layers\.(\d+)\.")),
        "intermediate_size": shapes["text_model.encoder.layers.0.mlp.fc1.weight"][0],
        "num_attention_heads": _heads(width, base["num_attention_heads"]),
    }
    if "text_projection.weight" in shapes:
        config["projection_dim"] = shapes["text_projection.weight"][0]
    return config


def note_guesses(component: str, derived: dict, fields: tuple[str, ...]) -> None:
    """Warn that a config was derived from the weights, naming the fields that were guessed."""
    guessed = [f"{f}={derived[f]}" for f in fields if f in derived]
    log.warning(
        "%s: sizes differ from the shipped config; derived the config from the weights%s",
        component,
        f" (guessed {', '.join(guessed)}: not visible in the weights)" if guessed else "",
    )


def fitted_rotary_axes(config: dict, head_dim: int, component: str) -> None:
    """Set a rotary transformer's ``axes_dims_rope`` for a head of ``head_dim`` when its released
    split (FLUX.1's and Qwen-Image's 16 + 56 + 56 of 128) does not fit: rows and columns keep
    7/16 each (even parts, as RoPE rotates pairs), the first axis the rest; a guess, noted."""
    if sum(config["axes_dims_rope"]) == head_dim:
        return
    side = 2 * (head_dim * 7 // 32)
    config["axes_dims_rope"] = (head_dim - 2 * side, side, side)
    note_guesses(component, config, ("axes_dims_rope",))
