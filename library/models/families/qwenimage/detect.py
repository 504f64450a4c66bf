"""Which weights are a Qwen-Image transformer's, by the layer names only it has."""

from __future__ import annotations

from collections.abc import Iterable

# Qwen-Image's dual-stream blocks modulate each stream by its own Linear (img_mod / txt_mod),
# names no other family's transformer has; ComfyUI's files prefix model.diffusion_model.
MARKS = ("img_mod.", "txt_mod.")


def detect_qwenimage(keys: Iterable[str]) -> str | None:
    """ "transformer" when the keys are a Qwen-Image transformer's, else None."""
    for key in keys:
        plain = key.removeprefix("model.diffusion_model.")
        if plain.startswith("transformer_blocks.") and plain.split(".", 2)[-1].startswith(MARKS):
            return "transformer"
    return None
