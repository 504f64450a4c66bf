"""Captions -> Z-Image's text conditioning, as ``ZImagePipeline._encode_prompt`` makes it.

The facts (diffusers 0.42.1, pipelines/z_image/pipeline_z_image.py):

- Each caption becomes one user turn of Qwen3's chat template with the generation prompt and
  ``enable_thinking=True``, i.e. the text
  ``"<|im_start|>user\\n{caption}<|im_end|>\\n<|im_start|>assistant\\n"`` (no empty think block:
  Qwen3's template writes that only when thinking is off). An empty caption is formatted the
  same way, so its conditioning is the template's tokens alone, never empty.
- The texts are tokenized together, padded to ``max_length`` (512 by default) with
  ``<|endoftext|>`` on the right and truncated to it (a caption that long loses the end of the
  template too).
- Qwen3 runs on the padded ids with the padding mask; the conditioning is the **second-to-last
  hidden state** (``hidden_states[-2]``: the output of the next-to-last decoder layer, before
  the final norm), not the last.
- Each caption keeps only its unpadded positions: the result is a **list** of [L_i, 2560]
  tensors of different lengths L_i, not a padded batch. The transformer takes that list as is
  (it pads each caption to a multiple of 32 with a learned pad token itself).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

# The Conditioning.unet_kwargs entry holding each caption's own length [B] (the rest of the
# batch's caption states is padding).
LENGTHS = "caption_lengths"

MAX_LENGTH = 512  # the pipeline's default max_sequence_length
HIDDEN_STATE_INDEX = -2  # hidden_states[-2]: the next-to-last decoder layer's output


def chat_text(tokenizer, caption: str) -> str:
    """``caption`` as the single user turn of the tokenizer's chat template, ready for the
    assistant's answer, with thinking enabled (as the pipeline asks)."""
    return tokenizer.apply_chat_template(
        [{"role": "user", "content": caption}],
        tokenize=False,
        add_generation_prompt=True,
        enable_thinking=True,
    )


def tokenize_captions(
    tokenizer, captions: Sequence[str], max_length: int = MAX_LENGTH
) -> tuple[torch.Tensor, torch.Tensor]:
    """(input ids [B, max_length], boolean padding mask [B, max_length]) of the chat texts."""
    batch = tokenizer(
        [chat_text(tokenizer, c) for c in captions],
        padding="max_length",
        max_length=max_length,
        truncation=True,
        return_tensors="pt",
    )
    return batch.input_ids, batch.attention_mask.bool()


def encode_token_ids(
    text_encoder: torch.nn.Module, input_ids: torch.Tensor, mask: torch.Tensor
) -> list[torch.Tensor]:
    """Qwen3's next-to-last hidden state at each caption's unpadded positions: a list of
    [L_i, hidden] tensors (ids and mask are moved to the encoder's device)."""
    device = next(text_encoder.parameters()).device
    input_ids, mask = input_ids.to(device), mask.to(device)
    hidden = text_encoder(
        input_ids=input_ids, attention_mask=mask, output_hidden_states=True
    ).hidden_states[HIDDEN_STATE_INDEX]
    return [states[keep] for states, keep in zip(hidden, mask, strict=True)]


def encode_captions(
    tokenizer,
    text_encoder: torch.nn.Module,
    captions: Sequence[str],
    max_length: int = MAX_LENGTH,
) -> list[torch.Tensor]:
    """Z-Image's conditioning of ``captions``: one [L_i, hidden] tensor per caption."""
    input_ids, mask = tokenize_captions(tokenizer, captions, max_length)
    return encode_token_ids(text_encoder, input_ids, mask)


def pad_caption_states(states: Sequence[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """(zero-padded batch [B, max L_i, hidden], lengths [B]): the list in one tensor, for caches
    and collation; ``unpad_caption_states`` gives the list back."""
    lengths = torch.tensor([len(s) for s in states], dtype=torch.long)
    padded = torch.nn.utils.rnn.pad_sequence(list(states), batch_first=True)
    return padded, lengths


def unpad_caption_states(padded: torch.Tensor, lengths: torch.Tensor) -> list[torch.Tensor]:
    """The per-caption list of a padded batch: row i cut to its first lengths[i] positions."""
    return [row[: int(n)] for row, n in zip(padded, lengths, strict=True)]
