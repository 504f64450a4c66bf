"""Text conditioning: captions to the text encoder's hidden states for cross-attention."""

from __future__ import annotations

import torch


def tokenize(tokenizer, captions: list[str]) -> torch.Tensor:
    """Token ids [B, model_max_length]: BOS, tokens, EOS, padded and truncated to the limit."""
    return tokenizer(
        list(captions),
        padding="max_length",
        max_length=tokenizer.model_max_length,
        truncation=True,
        return_tensors="pt",
    ).input_ids


def encode_token_ids(text_encoder: torch.nn.Module, input_ids: torch.Tensor) -> torch.Tensor:
    """The last hidden state [B, T, hidden] for token ids already on the encoder's device.

    This is the seam for clip_skip (take an earlier hidden state, then the final layer norm) and
    for long prompts (encode 75-token chunks and concatenate).

    Both families use the last hidden state: SD 1.x conditions on CLIP ViT-L's final layer, and
    an SD 2.x text encoder in diffusers format is stored with its last layer removed, so its final
    layer already is the penultimate OpenCLIP layer SD 2.x was trained on.

    No attention mask, as in SD's training: CLIP's causal mask already hides the padding from
    the real tokens, and the padded positions' outputs are part of the conditioning.
    """
    return text_encoder(input_ids, return_dict=True).last_hidden_state


def encode_prompts(
    tokenizer, text_encoder: torch.nn.Module, captions: list[str], device: torch.device | str
) -> torch.Tensor:
    """Encode captions to [B, model_max_length, hidden] on ``device``.

    Gradients flow when the text encoder has trainable parameters (text-encoder LoRA); wrap the
    call in torch.no_grad() when it is frozen.
    """
    input_ids = tokenize(tokenizer, captions).to(device)
    return encode_token_ids(text_encoder, input_ids)
