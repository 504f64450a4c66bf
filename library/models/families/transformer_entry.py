"""What the entries of the flow-matching transformer families (Flux.1, SD3) share.

Both read kohya's flow-matching [flow] keys and CLIP-L and T5-XXL files, sd-scripts' scripts for
both take its DiT arguments, and ComfyUI names their transformer layers alike.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from library.config.unsupported import Unsupported

# The [flow] keys every flow-matching transformer family reads: the CLIP-L and T5-XXL files and
# T5's tokenizer, the fused-layer and T5 arguments of kohya's networks, T5's caption settings and
# the density of the drawn noise level.
FLOW_MATCHING_KEYS = frozenset(
    {
        "clip_l",
        "t5xxl",
        "t5_tokenizer_path",
        "split_qkv",
        "train_t5xxl",
        "t5xxl_max_token_length",
        "apply_t5_attn_mask",
        "weighting_scheme",
        "logit_mean",
        "logit_std",
        "mode_scale",
    }
)
# The network_args both families' kohya networks take that difftune reads (as [flow] keys).
NETWORK_ARGS = ("split_qkv", "train_t5xxl")
# sd-scripts' DiT arguments (train_util), taken by the scripts of both.
DIT_OPTIONS = {
    "text_encoder_batch_size": Unsupported(
        "text encoders run at the training batch size; this changes no result",
        ignored=True,
    ),
}
# The component files both may be given as: lora_tool's options for them.
COMPONENT_OPTIONS = {
    "clip_l": "the CLIP-L text encoder file",
    "t5xxl": "the T5-XXL encoder file",
    "t5_tokenizer_path": "a folder with the T5 tokenizer (tokenizer.json)",
}


def refused_network_args(module: str, names: str) -> dict[str, str]:
    """The space-separated per-layer arguments of kohya's ``module``, refused by name."""
    return dict.fromkeys(
        names.split(), f"per-layer ranks and block selection of kohya's {module} are planned"
    )


def comfy_part_keys(
    heads: tuple[str, ...],
) -> Callable[[Any, str], dict[str, tuple[int, ...] | None]]:
    """The names ComfyUI's loader accepts for each diffusers part of a transformer layer: each
    of ``heads`` before the part's path (flattened after a head ending in "_")."""

    def keys(layer: Any, original: str) -> dict[str, tuple[int, ...] | None]:
        names: dict[str, tuple[int, ...] | None] = {}
        for index, path in enumerate(layer.parts):
            flat = path.replace(".", "_")
            for head in heads:
                names[head + (flat if head.endswith("_") else path)] = (index,)
        return names

    return keys
