"""A fully fine-tuned Krea 2 transformer as one file, as Krea distributes raw.safetensors: the
original names without a prefix (what ComfyUI, diffusers' from_single_file and difftune's own
single-file reader read), each block's modulation table flat. The header carries the diffusers
config, so the file reloads exactly without guessing."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from library.models.checkpoint_parts import CONFIG_METADATA
from library.models.families.krea2.spec import state_to_original
from library.saving.streamed import block_groups, save_streamed


def write_transformer_file(
    path: str | Path,
    transformer: torch.nn.Module,
    metadata: dict[str, str] | None = None,
    dtype: torch.dtype | None = None,
) -> Path:
    """Write ``transformer`` (a Krea2Transformer2DModel) to ``path``, floating tensors in
    ``dtype`` (None: as they are), atomically, one block at a time."""
    config = json.dumps(dict(transformer.config), default=list, sort_keys=True)
    header = {CONFIG_METADATA + "transformer": config, **dict(metadata or {})}
    groups = block_groups(transformer.state_dict(), ("transformer_blocks.",))
    return save_streamed(path, [(group, state_to_original) for group in groups], header, dtype)
