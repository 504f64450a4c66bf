"""Captions at their own lengths: padding, cutting back, masks, and the conditioning entry."""

from __future__ import annotations

import torch

from library.models import caption_lengths
from library.models.conditioning import TextConditioning


def test_padded_rows_round_trip():
    states = [torch.randn(3, 4), torch.randn(5, 4), torch.randn(1, 4)]
    hidden, lengths = caption_lengths.padded(states)
    assert hidden.shape == (3, 5, 4) and lengths.tolist() == [3, 5, 1]
    assert (hidden[0, 3:] == 0).all()
    cond = caption_lengths.conditioning(
        TextConditioning(hidden, None, None, lengths=lengths), "cpu"
    )
    back = caption_lengths.rows(cond)
    assert all(torch.equal(a, b) for a, b in zip(back, states, strict=True))
    assert caption_lengths.rows(cond, keep_batch=True)[1].shape == (1, 5, 4)


def test_text_conditioning_keeps_real_tokens_after_the_drop():
    hidden = torch.randn(2, 6, 3)
    mask = torch.tensor([[1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 1]]).bool()
    text = caption_lengths.text_conditioning(hidden, mask, drop=1)
    assert text.lengths.tolist() == [3, 5]
    assert torch.equal(text.hidden[0, :3], hidden[0, 1:4]) and (text.hidden[0, 3:] == 0).all()
    assert torch.equal(text.hidden[1], hidden[1, 1:])
    meta = caption_lengths.text_conditioning(hidden.to("meta"), mask, drop=1)
    assert meta.hidden.shape == (2, 5, 3) and meta.lengths.tolist() == [3, 5]


def test_whole_rows_without_lengths_and_masks():
    text = TextConditioning(torch.ones(2, 4, 3), None, None)
    cond = caption_lengths.conditioning(text, "cpu", torch.float16)
    assert cond.encoder_hidden_states.dtype == torch.float16
    assert cond.unet_kwargs[caption_lengths.LENGTHS].tolist() == [4, 4]
    assert caption_lengths.mask(torch.tensor([4, 4]), 4) is None
    expected = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 1]])
    assert torch.equal(caption_lengths.mask(torch.tensor([2, 4]), 4), expected)


def test_pipeline_rows_refuse_other_inputs():
    cond = caption_lengths.conditioning(TextConditioning(torch.ones(2, 4, 3), None, None), "cpu")
    cond.unet_kwargs["guidance"] = torch.ones(2)
    try:
        caption_lengths.pipeline_rows(cond, "SomePipeline")
    except ValueError as exc:
        assert "SomePipeline" in str(exc) and "'guidance'" in str(exc)
    else:
        raise AssertionError("no error")
