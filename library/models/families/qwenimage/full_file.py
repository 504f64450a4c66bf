"""A fully fine-tuned Qwen-Image transformer as one file, as Comfy-Org distributes
qwen_image_bf16.safetensors: diffusers' module names without a prefix (what ComfyUI, diffusers'
from_single_file and the spec's own reader (spec.py) read), written one block at a time. The
header carries the diffusers config, so the file reloads exactly (sizes and an edit release's
flags) without guessing."""

from __future__ import annotations

from pathlib import Path

import torch

from library.models.families.qwenimage.spec import SPEC
from library.models.families.spec_loader import write_main_file


def write_transformer_file(
    path: str | Path,
    transformer: torch.nn.Module,
    metadata: dict[str, str] | None = None,
    dtype: torch.dtype | None = None,
) -> Path:
    """Write ``transformer`` (a QwenImageTransformer2DModel) to ``path``, floating tensors in
    ``dtype`` (None: as they are), atomically."""
    return write_main_file(SPEC, Path(path), transformer, metadata, dtype)
