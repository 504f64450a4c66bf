"""Qwen3-VL as a text encoder whose conditioning is the hidden states of several of its layers,
kept as their own axis (not concatenated, not averaged): [B, tokens, layers, width].

The facts (diffusers 0.42.1 pipelines that read Qwen3-VL this way, on text alone):

- The model is transformers' ``Qwen3VLModel`` (vision tower and language model); only its
  language model runs, on token ids.
- A caption is written into a template whose user turn is padded *before* the template's
  closing tokens are appended: ``[prefix | caption | padding | suffix]``. Positions count only
  real tokens (padding takes none), so the suffix sits right after the caption as if there were
  no padding; the positions are the same on mRoPE's three axes (text has no height or width).
- ``hidden_states[i]`` (0: the token embeddings, i: the output of layer i) of the chosen
  layers are stacked on axis 2; a template's leading tokens (its system turn) are then dropped.

Every real token keeps its state; the padding's are never read (the consumer masks it). So a
caption's states are its real tokens' alone (``TappedQwen3VL.encode`` gives the batch padded at
the end to its longest caption, with each caption's length): the same states as the fixed-length
middle-padded layout, in an order the consumer cannot tell apart when its text tokens carry no
position.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

MROPE_AXES = 3  # Qwen3-VL's multimodal rotary positions: time, height, width


def text_positions(mask: torch.Tensor) -> torch.Tensor:
    """[3, B, L] position ids of token rows with padding ``mask`` [B, L] (True: a real token):
    each real token's count of real tokens before it, the same on the three mRoPE axes."""
    positions = (mask.long().cumsum(dim=-1) - 1).clamp(min=0)
    return positions.unsqueeze(0).expand(MROPE_AXES, -1, -1)


def tapped_states(
    encoder: torch.nn.Module, ids: torch.Tensor, mask: torch.Tensor, layers: Sequence[int]
) -> torch.Tensor:
    """[B, L, len(layers), width]: Qwen3-VL's hidden states of ``layers`` (indices into its
    ``hidden_states``, 0 the embeddings) for token ids [B, L] with padding ``mask``."""
    out = encoder(
        input_ids=ids,
        attention_mask=mask,
        position_ids=text_positions(mask),
        output_hidden_states=True,
    )
    return torch.stack([out.hidden_states[i] for i in layers], dim=2)


def unused_layers(layers: Sequence[int], num_layers: int) -> range:
    """The decoder layers whose output no tap reads (``hidden_states[i]`` is layer i - 1's
    output): those from the deepest tap on."""
    return range(min(max(layers), num_layers), num_layers)


@dataclass(frozen=True)
class TappedQwen3VL:
    """One model's way of reading Qwen3-VL: its template (``prefix`` before the caption,
    ``suffix`` after the padding), the ``drop`` leading tokens cut from the states, the tapped
    ``layers`` and at most ``max_tokens`` caption tokens after the drop (the suffix's
    ``suffix_tokens`` included, as the pipelines count them)."""

    prefix: str
    suffix: str
    drop: int
    suffix_tokens: int
    layers: tuple[int, ...]
    max_tokens: int = 512

    def token_ids(self, tokenizer, captions: Sequence[str]) -> tuple[torch.Tensor, torch.Tensor]:
        """(ids [B, L], boolean mask [B, L]): prefix + caption cut at the pipelines' length,
        padded to the batch's longest, then the suffix's tokens."""
        body = tokenizer(
            [self.prefix + caption for caption in captions],
            truncation=True,
            padding="longest",
            max_length=self.max_tokens + self.drop - self.suffix_tokens,
            return_tensors="pt",
        )
        tail = tokenizer([self.suffix] * len(captions), return_tensors="pt")
        ids = torch.cat([body.input_ids, tail.input_ids], dim=1)
        mask = torch.cat([body.attention_mask, tail.attention_mask], dim=1).bool()
        return ids, mask

    def encode(
        self, tokenizer, encoder: torch.nn.Module, captions: Sequence[str], device
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(states [B, n, len(layers), width] zero-padded at the end to the longest caption,
        lengths [B]): each caption's real tokens after the drop."""
        ids, mask = self.token_ids(tokenizer, captions)
        weight = next(encoder.parameters())
        if weight.is_meta:
            # The dry run's memory estimate runs on the meta device, where only shapes count.
            lengths = (mask.sum(dim=1) - self.drop).clamp(min=0)
            width = encoder.config.text_config.hidden_size
            shape = (len(captions), int(lengths.max()), len(self.layers), width)
            return torch.empty(shape, device="meta", dtype=weight.dtype), lengths
        mask = mask.to(device)
        states = tapped_states(encoder, ids.to(device), mask, self.layers)
        rows = [row[keep][self.drop :] for row, keep in zip(states, mask, strict=True)]
        lengths = torch.tensor([len(row) for row in rows], dtype=torch.long)
        return torch.nn.utils.rnn.pad_sequence(rows, batch_first=True), lengths
