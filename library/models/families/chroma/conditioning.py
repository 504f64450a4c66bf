"""Captions -> Chroma's text conditioning, as ``ChromaPipeline`` makes it.

The facts (diffusers 0.42.1, pipelines/chroma/pipeline_chroma.py ``_get_t5_prompt_embeds``,
``_prepare_attention_mask`` and ``ChromaTransformer2DModel``; lodestones' training code):

- T5-XXL alone (no CLIP, no pooled embedding): the captions are tokenized together, padded on
  the right to ``max_sequence_length`` (512, the most the pipeline takes) and truncated there;
  T5 runs with the tokenizer's padding mask and its last hidden state is the conditioning.
- The transformer masks the caption's padding in its attention, all but the FIRST padding token:
  text position k is attended when k <= the caption's token count (its end token included).
  Image tokens are always attended. The mask covers [text tokens, image tokens] and each block
  takes the outer product of it, so masked positions neither attend nor are attended to.
- diffusers 0.42.1's pipeline builds that mask in the text encoder's float dtype, which its
  attention then ADDS to the scores (a float mask is a bias for scaled_dot_product_attention)
  instead of masking; a boolean mask (given to the pipeline as prompt_attention_mask) masks.
  The model was trained with the padding masked, so this package always gives boolean masks.
"""

from __future__ import annotations

import torch

# The Conditioning entry holding the tokenizer's padding mask [B, T] of the captions.
TEXT_MASK = "text_mask"


def transformer_text_mask(padding_mask: torch.Tensor) -> torch.Tensor:
    """The text part of the transformer's mask [B, T] (bool) from the tokenizer's padding mask
    [B, T]: each caption's tokens and its first padding token."""
    lengths = padding_mask.sum(dim=1, keepdim=True)
    positions = torch.arange(padding_mask.shape[1], device=padding_mask.device)
    return positions[None, :] <= lengths


def attention_mask(padding_mask: torch.Tensor, image_tokens: int) -> torch.Tensor:
    """The transformer's ``attention_mask`` [B, T + image tokens] (bool): text as
    ``transformer_text_mask``, then every image token."""
    text = transformer_text_mask(padding_mask)
    image = torch.ones(text.shape[0], image_tokens, dtype=torch.bool, device=text.device)
    return torch.cat([text, image], dim=1)
