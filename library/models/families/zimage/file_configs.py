"""Z-Image component configs read off a single file's tensor shapes.

A transformer file (original names, prefix stripped) shows every size but the rotary split of
the head width (``axes_dims``); a Qwen3 file (Qwen3Model names) shows every size but the position
table's length, which its rotary embedding does not store. The sizes that do not show are the
released model's (shapes.py), so the full-size files give exactly the released configs and
smaller (pruned, tiny) ones load too.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from library.models import shape_configs
from library.models.families.zimage import shapes

Shapes = Mapping[str, tuple[int, ...]]


def _count(shapes_: Shapes, group: str) -> int:
    """How many numbered blocks ``<group>.<i>.`` the keys hold (the highest index + 1)."""
    pattern = re.compile(re.escape(group) + r"\.(\d+)\.")
    found = [int(m.group(1)) for k in shapes_ if (m := pattern.match(k))]
    return 1 + max(found) if found else 0


def transformer_config(original: Shapes) -> dict:
    """ZImageTransformer2DModel kwargs for original-named shapes (KeyError naming a key the
    sizes are read from when it is missing)."""
    base = shapes.transformer_config()
    dim, patch_width = original["x_embedder.weight"]
    head_dim = original["layers.0.attention.q_norm.weight"][0]
    patch = base["all_patch_size"][0] ** 2 * base["all_f_patch_size"][0]
    config = {
        **base,
        "in_channels": patch_width // patch,
        "dim": dim,
        "n_layers": _count(original, "layers"),
        "n_refiner_layers": _count(original, "noise_refiner"),
        "n_heads": dim // head_dim,
        "n_kv_heads": dim // head_dim,  # q, k and v are equal thirds of the fused qkv
        "cap_feat_dim": original["cap_embedder.1.weight"][1],
    }
    if sum(base["axes_dims"]) != head_dim:
        # The released split gives 3/8 of each head to rows and to columns (48 of 128) and the
        # rest to the caption / frame index; a smaller head keeps the proportions (even parts).
        side = 2 * (head_dim * 3 // 16)
        config["axes_dims"] = [head_dim - 2 * side, side, side]
        shape_configs.note_guesses("Z-Image transformer", config, ("axes_dims",))
    return config


def text_encoder_config(plain: Shapes) -> dict:
    """Qwen3Config kwargs for Qwen3Model-named shapes (KeyError naming a missing key)."""
    vocab, hidden = plain["embed_tokens.weight"]
    head_dim = plain["layers.0.self_attn.q_norm.weight"][0]
    return {
        **shapes.text_encoder_config(),
        "vocab_size": vocab,
        "hidden_size": hidden,
        "intermediate_size": plain["layers.0.mlp.gate_proj.weight"][0],
        "num_hidden_layers": _count(plain, "layers"),
        "num_attention_heads": plain["layers.0.self_attn.q_proj.weight"][0] // head_dim,
        "num_key_value_heads": plain["layers.0.self_attn.k_proj.weight"][0] // head_dim,
        "head_dim": head_dim,
        "attention_bias": "layers.0.self_attn.q_proj.bias" in plain,
    }
