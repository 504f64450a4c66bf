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


def encode_token_ids(
    text_encoder: torch.nn.Module, input_ids: torch.Tensor, clip_skip: int | None = None
) -> torch.Tensor:
    """The conditioning hidden states [B, T, hidden] for token ids on the encoder's device.

    ``clip_skip`` counts layers from the end as kohya and A1111 do: None or 1 is the last
    layer's output, N > 1 the output of layer ``num_layers - N + 1``; either way passed through
    the final layer norm, as the last layer's output always is.

    Both families use the last hidden state by default: SD 1.x conditions on CLIP ViT-L's final
    layer, and an SD 2.x text encoder in diffusers format is stored with its last layer removed,
    so its final layer already is the penultimate OpenCLIP layer SD 2.x was trained on (clip_skip
    counts from there, as in kohya).

    No attention mask, as in SD's training: CLIP's causal mask already hides the padding from
    the real tokens, and the padded positions' outputs are part of the conditioning.

    This is also the seam for long prompts (encode 75-token chunks and concatenate).
    """
    if clip_skip is None or clip_skip == 1:
        return text_encoder(input_ids, return_dict=True).last_hidden_state
    inner = getattr(text_encoder, "module", text_encoder)  # unwrap DistributedDataParallel
    layers = inner.config.num_hidden_layers
    if not 1 <= clip_skip <= layers:
        raise ValueError(f"clip_skip {clip_skip} is outside 1..{layers} (the encoder's layers)")
    out = text_encoder(input_ids, output_hidden_states=True, return_dict=True)
    # hidden_states[0] is the embedding output, [i] the output of layer i.
    return final_layer_norm(inner)(out.hidden_states[-clip_skip])


def final_layer_norm(text_encoder: torch.nn.Module) -> torch.nn.Module:
    """The CLIP text model's final LayerNorm (transformers 5 flattened CLIPTextModel; the
    with-projection model and transformers 4 keep it under ``text_model``)."""
    inner = getattr(text_encoder, "text_model", text_encoder)
    return inner.final_layer_norm


def encode_prompts(
    tokenizer,
    text_encoder: torch.nn.Module,
    captions: list[str],
    device: torch.device | str,
    clip_skip: int | None = None,
) -> torch.Tensor:
    """Encode captions to [B, model_max_length, hidden] on ``device``.

    Gradients flow when the text encoder has trainable parameters (text-encoder LoRA); wrap the
    call in torch.no_grad() when it is frozen. ``clip_skip``: see ``encode_token_ids``.
    """
    input_ids = tokenize(tokenizer, captions).to(device)
    return encode_token_ids(text_encoder, input_ids, clip_skip)
