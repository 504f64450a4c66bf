"""Qwen3 as a text encoder: captions as chat turns, and the hidden states of chosen layers.

Pipelines that condition on a Qwen3 decoder (diffusers 0.42.1's Flux2KleinPipeline,
ZImagePipeline) share these steps:

- each caption is the single user turn of the tokenizer's chat template, followed by the
  assistant's generation prompt; ``thinking`` is the template's ``enable_thinking`` (False adds
  Qwen3's empty ``<think>`` block, as Flux2KleinPipeline asks; True leaves it out, as
  ZImagePipeline asks);
- the texts are tokenized together, padded with the tokenizer's padding token on the right to
  ``max_length`` and truncated to it;
- Qwen3 runs on the padded ids with the padding mask (``use_cache=False``) and returns every
  layer's hidden states; ``hidden_states[k]`` is the output of decoder layer k (0: the
  embeddings), before the final norm except for the last;
- the conditioning is the chosen layers' states joined per token, layer after layer
  ([B, L, n * hidden]: Flux2KleinPipeline stacks (9, 18, 27) so; hidden_states.py).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


def chat_text(tokenizer, caption: str, thinking: bool) -> str:
    """``caption`` as the single user turn of the chat template, ready for the answer."""
    return tokenizer.apply_chat_template(
        [{"role": "user", "content": caption}],
        tokenize=False,
        add_generation_prompt=True,
        enable_thinking=thinking,
    )


def tokenize(
    tokenizer, captions: Sequence[str], max_length: int, thinking: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """(input ids [B, max_length], boolean padding mask [B, max_length]) of the chat texts."""
    batch = tokenizer(
        [chat_text(tokenizer, c, thinking) for c in captions],
        padding="max_length",
        max_length=max_length,
        truncation=True,
        return_tensors="pt",
    )
    return batch.input_ids, batch.attention_mask.bool()
