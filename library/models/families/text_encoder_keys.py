"""The [flow] key of the families whose one text encoder comes as its own file beside a single
transformer file (a Qwen language model in each): musubi-tuner's --text_encoder."""

from __future__ import annotations

from pydantic import Field

from library.config.section import Section


class TextEncoderFileKeys(Section):
    """The text encoder file (musubi-tuner's --text_encoder)."""

    text_encoder: str | None = Field(
        None,
        description="The text encoder file of a model given as its transformer file "
        "(.safetensors in transformers' key names, as ComfyUI distributes qwen_3_4b.safetensors "
        "and qwen_2.5_vl_7b.safetensors; musubi-tuner's --text_encoder). Needed with such a "
        "transformer file; with a diffusers folder it replaces the folder's text_encoder/.",
    )
