"""Mistral Small 3 (Mistral3ForConditionalGeneration) as a text encoder: captions as chat turns.

Flux2Pipeline (diffusers 0.42.1) encodes each caption as a conversation of the system message
Black Forest Labs wrote for FLUX.2 (diffusers' ``pipelines.flux2.system_messages.SYSTEM_MESSAGE``,
read from there) and the caption as the user's text (``[IMG]`` markers taken out), through the
tokenizer's (or processor's) chat template without a generation prompt, padded on the right to
``max_length`` and truncated to it; the conditioning is the hidden states of chosen layers joined
per token (hidden_states.py; FLUX.2 [dev]: 10, 20 and 30).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


def system_message() -> str:
    """FLUX.2's system message, as diffusers ships it."""
    from diffusers.pipelines.flux2.system_messages import SYSTEM_MESSAGE

    return SYSTEM_MESSAGE


def conversation(caption: str, system: str) -> list[dict]:
    """One caption as the pipeline's conversation: the system turn, then the user's text."""
    text = caption.replace("[IMG]", "")  # an image marker without an image breaks the template
    return [
        {"role": "system", "content": [{"type": "text", "text": system}]},
        {"role": "user", "content": [{"type": "text", "text": text}]},
    ]


def tokenize(
    tokenizer, captions: Sequence[str], max_length: int, system: str | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """(input ids [B, max_length], boolean padding mask [B, max_length]) of the conversations."""
    system = system_message() if system is None else system
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
