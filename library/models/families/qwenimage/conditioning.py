"""Captions -> Qwen-Image's text conditioning, as ``QwenImagePipeline._get_qwen_prompt_embeds``
makes it.

The facts (diffusers 0.42.1, pipelines/qwenimage/pipeline_qwenimage.py):

- Each caption is put into a fixed template (no chat template is applied): a system turn
  asking to describe the image, the caption as the user turn, then the assistant's turn opened:
  ``TEMPLATE`` below.
- The texts are tokenized together, padded to the longest with ``<|endoftext|>`` and truncated
  to 1024 + 34 tokens.
- Qwen2.5-VL (Qwen2_5_VLForConditionalGeneration, its language model on text alone) runs on the
  ids with the padding mask; the conditioning is the **last hidden state** (``hidden_states[-1]``,
  after the final norm).
- Each caption keeps its unpadded positions, then drops its first ``DROP_TOKENS`` = 34 (the
  template's system turn and the user turn's opening, as Qwen's tokenizer splits them: a fixed
  count, dropped whatever the tokenizer). The captions are zero-padded to the longest of the
  batch with a mask of their lengths; the pipeline passes no mask (None) when every caption has
  the same length (the shared library/models/caption_lengths.py carries them so).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from library.models.caption_lengths import LENGTHS, padded, text_conditioning
from library.models.conditioning import TextConditioning
from library.models.text_encoders.hidden_states import layer_states

__all__ = ["LENGTHS", "encode", "padded", "tokenize_captions"]

TEMPLATE = (
    "<|im_start|>system\nDescribe the image by detailing the color, shape, size, texture, "
    "quantity, text, spatial relationships of the objects and background:<|im_end|>\n"
    "<|im_start|>user\n{}<|im_end|>\n<|im_start|>assistant\n"
)
DROP_TOKENS = 34  # the pipeline's prompt_template_encode_start_idx
MAX_LENGTH = 1024  # the pipeline's tokenizer_max_length (caption tokens after the drop)
HIDDEN_STATE_INDEX = -1


def tokenize_captions(
    tokenizer, captions: Sequence[str], max_length: int = MAX_LENGTH
) -> tuple[torch.Tensor, torch.Tensor]:
    """(input ids [B, L], boolean padding mask [B, L]) of the templated captions, padded to the
    longest and cut at ``max_length`` + DROP_TOKENS tokens."""
    batch = tokenizer(
        [TEMPLATE.format(c) for c in captions],
        max_length=max_length + DROP_TOKENS,
        padding=True,
        truncation=True,
        return_tensors="pt",
    )
    return batch.input_ids, batch.attention_mask.bool()


def encode(tokenizer, encoder, captions: Sequence[str], max_length: int) -> TextConditioning:
    """Qwen2.5-VL's last hidden states of the templated captions without the template's first
    DROP_TOKENS, padded to the batch's longest caption (padding zeroed), with their lengths."""
    ids, mask = tokenize_captions(tokenizer, captions, max_length)
    hidden = layer_states(encoder, ids, mask, (HIDDEN_STATE_INDEX,))
    return text_conditioning(hidden, mask, DROP_TOKENS)
