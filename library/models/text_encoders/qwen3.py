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
  ([B, L, n * hidden]: Flux2KleinPipeline stacks (9, 18, 27) so).
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


def hidden_width(encoder: torch.nn.Module) -> int:
    """The encoder's hidden size (a causal LM's and a bare model's config alike)."""
    config = encoder.config
    return getattr(config, "text_config", config).hidden_size


def layer_states(
    encoder: torch.nn.Module,
    input_ids: torch.Tensor,
    mask: torch.Tensor,
    layers: Sequence[int],
) -> torch.Tensor:
    """The hidden states of ``layers`` joined per token: [B, L, len(layers) * hidden], in the
    encoder's dtype on its device. On the meta device (the dry run's memory estimate, where
    Qwen3's mask code reads values) an empty tensor of that shape: the encoder never trains, so
    its forward keeps nothing for backward."""
    weight = next(encoder.parameters())
    if weight.is_meta:
        shape = (*input_ids.shape, len(layers) * hidden_width(encoder))
        return torch.empty(shape, device="meta", dtype=weight.dtype)
    out = encoder(
        input_ids=input_ids.to(weight.device),
        attention_mask=mask.to(weight.device),
        output_hidden_states=True,
        use_cache=False,
    )
    return torch.cat([out.hidden_states[k] for k in layers], dim=-1)
