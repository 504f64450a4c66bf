"""Text conditioning: captions to the text encoder's hidden states for cross-attention.

Long prompts (``max_token_length`` 150 or 225) follow kohya sd-scripts' chunked CLIP encoding,
so LoRAs trained here see the same conditioning as there. The encoder only has 77 positions,
so a caption is tokenized to ``max_token_length + 2`` tokens (BOS, content, EOS, padding), the
content is cut into n = max_token_length / 75 windows of 75 tokens, and each window is encoded
as its own 77-token sequence:

    BOS, the window's 75 tokens, the long sequence's last token (EOS when the caption filled or
    overflowed the long sequence, padding otherwise).

When the tokenizer pads with a token other than EOS (SD 2.x, SDXL's second tokenizer pad with
"!"), two fix-ups keep every window a well-formed CLIP input, as kohya's ``_get_input_ids``
does: a window whose 75th token is text (neither EOS nor padding; the caption continues or was
cut there) gets EOS as its final token, and a window whose first token is padding (the caption
ended in an earlier window) gets EOS right after BOS, so it reads as an empty prompt. With
EOS padding (SD 1.x, SDXL's first tokenizer) the windows are already well formed.

The n x 77 hidden states are joined back into 2 + 75n tokens (77, 152, 227): the first
window's BOS state, every window's 75 content states in order, then the last window's final
state. kohya also has a hidden-state fix-up for empty windows under "!" padding (copying the
state after EOS onto the EOS slot); its condition never holds in kohya's SD 1/2 code (it
compares a token id with the EOS *string*) and it is commented out for SDXL, so it is not done
here either. ``max_token_length`` None or 75 is the plain single 77-token encoding.
"""

from __future__ import annotations

import torch

WINDOW = 75  # content tokens per window; each window is encoded as BOS + 75 + final token
MAX_TOKEN_LENGTHS = (75, 150, 225)


def window_count(max_token_length: int | None) -> int:
    """How many 75-token windows ``max_token_length`` asks for (None means 1)."""
    if max_token_length is None:
        return 1
    if max_token_length not in MAX_TOKEN_LENGTHS:
        allowed = ", ".join(str(v) for v in MAX_TOKEN_LENGTHS)
        raise ValueError(
            f"max_token_length must be one of {allowed} (or unset), not {max_token_length!r}"
        )
    return max_token_length // WINDOW


def tokenize(tokenizer, captions: list[str], max_token_length: int | None = None) -> torch.Tensor:
    """Token ids of ``captions``.

    With one window (``max_token_length`` None or 75): [B, model_max_length], BOS, tokens, EOS,
    padded and truncated to the limit. With n > 1 windows: [B, n, 77], each row one window's
    sequence as described in the module docstring.
    """
    windows = window_count(max_token_length)
    if windows == 1:
        return tokenizer(
            list(captions),
            padding="max_length",
            max_length=tokenizer.model_max_length,
            truncation=True,
            return_tensors="pt",
        ).input_ids
    ids = tokenizer(
        list(captions),
        padding="max_length",
        max_length=windows * WINDOW + 2,
        truncation=True,
        return_tensors="pt",
    ).input_ids
    return _split_into_windows(ids, windows, tokenizer.eos_token_id, tokenizer.pad_token_id)


def _split_into_windows(ids: torch.Tensor, windows: int, eos: int, pad: int) -> torch.Tensor:
    """[B, 2 + 75n] long-sequence ids to [B, n, 77] window sequences (module docstring)."""
    first, last = ids[:, :1], ids[:, -1:]
    parts = []
    for k in range(windows):
        seq = torch.cat([first, ids[:, 1 + k * WINDOW : 1 + (k + 1) * WINDOW], last], dim=1)
        if pad != eos:
            ends_in_text = (seq[:, -2] != eos) & (seq[:, -2] != pad)
            seq[:, -1] = torch.where(ends_in_text, eos, seq[:, -1])
            empty = seq[:, 1] == pad
            seq[:, 1] = torch.where(empty, eos, seq[:, 1])
        parts.append(seq)
    return torch.stack(parts, dim=1)


def flatten_windows(input_ids: torch.Tensor) -> tuple[torch.Tensor, int]:
    """Window ids as one batch of encoder inputs: ([B * n, 77], n); [B, 77] ids pass as n = 1.

    Rows are sample-major (sample 0's windows, then sample 1's, ...).
    """
    if input_ids.dim() == 2:
        return input_ids, 1
    return input_ids.reshape(-1, input_ids.shape[-1]), input_ids.shape[1]


def join_windows(hidden: torch.Tensor, windows: int) -> torch.Tensor:
    """Per-window hidden states [B * n, 77, C] back to [B, 2 + 75n, C] (module docstring).

    No in-place writes, so gradients reach every window's encoding.
    """
    if windows == 1:
        return hidden
    per_sample = hidden.reshape(-1, windows, *hidden.shape[1:])  # [B, n, 77, C]
    content = per_sample[:, :, 1:-1].reshape(per_sample.shape[0], -1, hidden.shape[-1])
    return torch.cat([per_sample[:, 0, :1], content, per_sample[:, -1, -1:]], dim=1)


def encode_token_ids(
    text_encoder: torch.nn.Module, input_ids: torch.Tensor, clip_skip: int | None = None
) -> torch.Tensor:
    """The conditioning hidden states [B, T, hidden] for token ids on the encoder's device.

    ``input_ids`` is [B, 77], or [B, n, 77] windows from ``tokenize`` with a long
    ``max_token_length``: each window is encoded on its own and the result joined to
    T = 2 + 75n tokens (module docstring).

    ``clip_skip`` counts layers from the end as kohya and A1111 do: None or 1 is the last
    layer's output, N > 1 the output of layer ``num_layers - N + 1``; either way passed through
    the final layer norm, as the last layer's output always is. It applies per window.

    Both families use the last hidden state by default: SD 1.x conditions on CLIP ViT-L's final
    layer, and an SD 2.x text encoder in diffusers format is stored with its last layer removed,
    so its final layer already is the penultimate OpenCLIP layer SD 2.x was trained on (clip_skip
    counts from there, as in kohya).

    No attention mask, as in SD's training: CLIP's causal mask already hides the padding from
    the real tokens, and the padded positions' outputs are part of the conditioning.
    """
    flat, windows = flatten_windows(input_ids)
    return join_windows(_encode_sequences(text_encoder, flat, clip_skip), windows)


def _encode_sequences(
    text_encoder: torch.nn.Module, input_ids: torch.Tensor, clip_skip: int | None
) -> torch.Tensor:
    """Hidden states [B, 77, hidden] of plain 77-token sequences."""
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
    max_token_length: int | None = None,
) -> torch.Tensor:
    """Encode captions to [B, T, hidden] on ``device``; T = 77, or 2 + 75n for long prompts.

    Gradients flow when the text encoder has trainable parameters (text-encoder LoRA); wrap the
    call in torch.no_grad() when it is frozen. ``clip_skip``: see ``encode_token_ids``;
    ``max_token_length`` (None, 75, 150, 225): see the module docstring.
    """
    input_ids = tokenize(tokenizer, captions, max_token_length).to(device)
    return encode_token_ids(text_encoder, input_ids, clip_skip)
