"""What a denoiser is conditioned on besides the noisy latents and the timesteps: the data.

How a family builds it from captions and sizes is library.models.conditioning's and the
family's (library.models.families.base), which both build on these types.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass
class Conditioning:
    """UNet inputs besides the noisy latents and timesteps.

    Call the UNet as ``unet(x, t, c.encoder_hidden_states, **c.unet_kwargs)``. ``unet_kwargs``
    is {} for SD 1.x/2.x and ``{"added_cond_kwargs": {"text_embeds": [B, pooled],
    "time_ids": [B, 6]}}`` for SDXL.
    """

    encoder_hidden_states: torch.Tensor  # [B, tokens, sum of the encoders' hidden sizes]
    unet_kwargs: dict = field(default_factory=dict)

    def to(self, dtype: torch.dtype) -> Conditioning:
        """Every tensor cast to ``dtype`` (the UNet's weight dtype); gradients still flow."""
        added = self.unet_kwargs.get("added_cond_kwargs")
        kwargs = dict(self.unet_kwargs)
        if added is not None:
            kwargs["added_cond_kwargs"] = {k: v.to(dtype) for k, v in added.items()}
        return Conditioning(self.encoder_hidden_states.to(dtype), kwargs)


@dataclass
class TextConditioning:
    """The caption-dependent part of the conditioning, one row per caption (what a text-encoder
    output cache stores)."""

    hidden: torch.Tensor  # [B, T, sum of the encoders' hidden sizes]
    pooled: torch.Tensor | None = None  # [B, P]: the last encoder's projected pooled embedding
    # [B, T] 1 for caption tokens, 0 for padding, where the family masks padding (Flux.1 with
    # apply_t5_attn_mask). Not cached: the family recomputes it from the tokenizer (text_mask).
    mask: torch.Tensor | None = None
    # [B] each caption's own token count, where captions keep their own lengths (the family
    # drops row i's states after lengths[i], which are zeros): the text cache stores each row
    # cut to it and pads a batch of rows again. None: every row is whole (all T tokens count).
    lengths: torch.Tensor | None = None
