"""Z-Image's own [flow] key: its Qwen3 text encoder file beside a single transformer file."""

from __future__ import annotations

from pydantic import Field

from library.config.section import Section


class ZImageFlowKeys(Section):
    """The text encoder file (musubi-tuner's --text_encoder)."""

    text_encoder: str | None = Field(
        None,
        description="Z-Image: the Qwen3-4B text encoder file (.safetensors, transformers' key "
        "names with or without model., as ComfyUI distributes qwen_3_4b.safetensors; "
        "musubi-tuner's --text_encoder). Needed with a transformer file; with a diffusers "
        "folder it replaces the folder's text_encoder/.",
    )
