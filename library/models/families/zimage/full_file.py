"""A fully fine-tuned Z-Image transformer as one file in the original names.

ComfyUI loads Z-Image transformer files with the original module names (its Lumina2 / NextDiT
model), and so do diffusers' from_single_file and difftune's own single-file reader (files.py):
its name table (keys.py, spec.py) in the diffusers -> original direction, the fused qkv built per block while it
is written. The header carries the diffusers config and the sampling scheduler config, so the
file reloads exactly (sizes and variant) without guessing.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from library.models.families.spec_loader import write_main_file
from library.models.families.zimage.shapes import SCHEDULER_SHIFT
from library.models.families.zimage.spec import SPEC
from library.models.plans import CONFIG_METADATA


def scheduler_header(shift: float) -> dict:
    """The sampling scheduler config of a model sampled with ``shift`` (a static shift, as
    both releases)."""
    return {"num_train_timesteps": 1000, "use_dynamic_shifting": False, "shift": float(shift)}


def write_transformer_file(
    path: str | Path,
    transformer: torch.nn.Module,
    shift: float = SCHEDULER_SHIFT["turbo"],
    metadata: dict[str, str] | None = None,
    dtype: torch.dtype | None = None,
) -> Path:
    """Write ``transformer`` (a ZImageTransformer2DModel) to ``path`` in the original names,
    without a prefix, floating tensors in ``dtype`` (None: as they are), atomically."""
    scheduler = json.dumps(scheduler_header(shift), sort_keys=True)
    header = {CONFIG_METADATA + "scheduler": scheduler, **dict(metadata or {})}
    return write_main_file(SPEC, Path(path), transformer, header, dtype)
