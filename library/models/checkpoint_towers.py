"""What every original-layout checkpoint reader and writer shares: the description of a text
encoder inside the file, and the keys that are never weights of a component. A family's own
layouts (library/models/families/sd/checkpoint_layout.py) are built from these."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal


@dataclass(frozen=True)
class TextTower:
    """One text encoder inside a checkpoint file."""

    kind: Literal["clip", "openclip"]  # OpenAI CLIP (transformers names) or OpenCLIP names
    prefix: str  # key prefix in the file
    subfolder: str  # diffusers name: text_encoder / text_encoder_2
    with_projection: bool = False  # CLIPTextModelWithProjection (SDXL's pooled embedding)
    # SD 2.x conditions on OpenCLIP's penultimate block: original files carry one block more than
    # the diffusers encoder has; the loader drops it and the exporter writes a copy of the last.
    extra_last_block: bool = False


# Keys a checkpoint may hold that are not weights of a component (the training noise schedule,
# EMA copies, OpenCLIP's contrastive temperature): never loaded, never an error.
IGNORED_SUFFIXES = ("position_ids", "logit_scale", "attn_mask")
