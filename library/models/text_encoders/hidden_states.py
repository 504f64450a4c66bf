"""The hidden states of chosen layers of a text encoder, joined per token.

Pipelines that condition on a language model's intermediate layers (Flux2KleinPipeline on
Qwen3's 9, 18 and 27, Flux2Pipeline on Mistral 3's 10, 20 and 30) run it on the padded ids with
the padding mask (``use_cache=False``), take every layer's hidden states (``hidden_states[k]``:
decoder layer k's output, 0 the embeddings) and join the chosen ones per token, layer after
layer: [B, L, n * hidden].
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


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
