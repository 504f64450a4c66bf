"""A fully fine-tuned Qwen-Image transformer as one file, as Comfy-Org distributes
qwen_image_bf16.safetensors: diffusers' module names without a prefix (what ComfyUI, diffusers'
from_single_file and difftune's own single-file reader (files.py) read). The header carries the
diffusers config, so the file reloads exactly (sizes and an edit release's flags) without
guessing."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from library.models.checkpoint_parts import CONFIG_METADATA
from library.saving.streamed import block_groups, save_streamed


def write_transformer_file(
    path: str | Path,
    transformer: torch.nn.Module,
    metadata: dict[str, str] | None = None,
    dtype: torch.dtype | None = None,
) -> Path:
    """Write ``transformer`` (a QwenImageTransformer2DModel) to ``path``, floating tensors in
    ``dtype`` (None: as they are), atomically, one block at a time."""
    config = json.dumps(dict(transformer.config), default=list, sort_keys=True)
    header = {CONFIG_METADATA + "transformer": config, **dict(metadata or {})}
    blocks = block_groups(transformer.state_dict(), ("transformer_blocks.",))
    return save_streamed(path, blocks, header, dtype)
