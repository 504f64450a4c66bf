"""Captions kept at their own lengths: the conditioning of transformers that read each caption's
real tokens alone (their pipelines cut the padding away or mask it).

A batch's caption states travel as one tensor [B, longest, ...] zero-padded at the end, with
each caption's length (TextConditioning.lengths, cached with the states); the conditioning
carries the lengths under ``LENGTHS``, and the denoiser call and the sampling pipeline cut each
row back to its length (``rows``) or mask the rest (``mask``).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from library.models.conditioning import Conditioning, TextConditioning
from library.sampling.pipelines import refuse_uncarried

# The Conditioning.unet_kwargs entry holding each caption's own length [B].
LENGTHS = "caption_lengths"


def padded(states: Sequence[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """(zero-padded batch [B, max L_i, ...], lengths [B]) of per-caption states [L_i, ...]."""
    lengths = torch.tensor([len(s) for s in states], dtype=torch.long)
    return torch.nn.utils.rnn.pad_sequence(list(states), batch_first=True), lengths


def text_conditioning(hidden: torch.Tensor, mask: torch.Tensor, drop: int = 0) -> TextConditioning:
    """The states [B, L, ...] of right-padded token rows (``mask`` [B, L], True: a real token)
    at each caption's own length, without its first ``drop`` tokens. On the meta device (the
    dry run's memory estimate) only the shape is made."""
    lengths = (mask.sum(dim=1) - drop).clamp(min=0)
    if hidden.is_meta:
        return TextConditioning(hidden[:, : int(lengths.max())], None, None, lengths=lengths)
    mask = mask.to(hidden.device)
    states, lengths = padded([row[keep][drop:] for row, keep in zip(hidden, mask, strict=True)])
    return TextConditioning(states, None, None, lengths=lengths)


def conditioning(text: TextConditioning, device, dtype=None) -> Conditioning:
    """The denoiser's conditioning: the states on ``device`` (in ``dtype``) with their lengths
    (a text cache batch without lengths has every row whole)."""
    hidden = text.hidden.to(device, dtype or text.hidden.dtype)
    lengths = text.lengths
    if lengths is None:
        lengths = torch.full((hidden.shape[0],), hidden.shape[1], dtype=torch.long)
    return Conditioning(hidden, {LENGTHS: lengths.cpu()})


def rows(cond: Conditioning, keep_batch: bool = False) -> list[torch.Tensor]:
    """Each caption's states at its own length: [L_i, ...] (``keep_batch``: [1, L_i, ...])."""
    hidden = cond.encoder_hidden_states
    lengths = cond.unet_kwargs[LENGTHS].tolist()
    return [hidden[i : i + 1, :n] if keep_batch else hidden[i, :n] for i, n in enumerate(lengths)]


def pipeline_rows(cond: Conditioning, pipeline: str, keep_batch: bool = False) -> list:
    """``rows`` for a sampling pipeline that takes the states alone: ValueError for any other
    conditioning input, which the pipeline would silently drop."""
    refuse_uncarried(cond, (LENGTHS,), pipeline)
    return rows(cond, keep_batch)


def mask(lengths: torch.Tensor, width: int) -> torch.Tensor | None:
    """The attention mask [B, width] of captions of ``lengths`` (ones over each caption), or
    None when every caption fills the width."""
    kept = torch.arange(width)[None, :] < lengths.reshape(-1, 1).cpu()
    return None if bool(kept.all()) else kept.long()
