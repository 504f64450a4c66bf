"""Mistral Small 3 (Mistral3ForConditionalGeneration) as a text encoder: captions as chat turns.

A pipeline conditioning on Mistral 3 (diffusers 0.42.1's Flux2Pipeline) encodes each caption as
a conversation of the model's system message (the family's) and the caption as the user's text
(``[IMG]`` markers taken out), through the tokenizer's (or processor's) chat template without a
generation prompt, padded on the right to ``max_length`` and truncated to it; the conditioning is
the hidden states of chosen layers joined per token (hidden_states.py).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


def conversation(caption: str, system: str) -> list[dict]:
    """One caption as the pipeline's conversation: the system turn, then the user's text."""
    text = caption.replace("[IMG]", "")  # an image marker without an image breaks the template
    return [
        {"role": "system", "content": [{"type": "text", "text": system}]},
        {"role": "user", "content": [{"type": "text", "text": text}]},
    ]


def tokenize(
    tokenizer, captions: Sequence[str], max_length: int, system: str
) -> tuple[torch.Tensor, torch.Tensor]:
    """(input ids [B, max_length], boolean padding mask [B, max_length]) of the conversations
    that start with the ``system`` message."""
    batch = tokenizer.apply_chat_template(
        [conversation(c, system) for c in captions],
        add_generation_prompt=False,
        tokenize=True,
        return_dict=True,
        return_tensors="pt",
        padding="max_length",
        truncation=True,
        max_length=max_length,
    )
    return batch["input_ids"], batch["attention_mask"].bool()
