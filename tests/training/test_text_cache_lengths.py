"""TextEncoderCache with captions of their own lengths (TextConditioning.lengths): entries hold
each caption's states alone, batches come back zero-padded with their lengths, from memory and
from disk; encodings without lengths still come back stacked, without lengths."""

from __future__ import annotations

import torch
from safetensors import safe_open

from library.models.conditioning import TextConditioning
from library.training.text_cache import TextEncoderCache

WIDTH = 3


def states(caption: str) -> torch.Tensor:
    """A caption's own states: one row per character, values that tell captions apart."""
    rows = [[float(ord(ch)), float(i), float(len(caption))] for i, ch in enumerate(caption)]
    return torch.tensor(rows)


def ragged_encode(calls: list):
    """An encoder of captions of their own lengths: padded to the call's longest caption with
    noise (what an encoder computes at padding positions), and the lengths."""

    def encode(captions: list[str]) -> TextConditioning:
        calls.append(list(captions))
        longest = max(len(c) for c in captions)
        hidden = torch.randn(len(captions), longest, WIDTH)
        for i, caption in enumerate(captions):
            hidden[i, : len(caption)] = states(caption)
        lengths = torch.tensor([len(c) for c in captions])
        return TextConditioning(hidden, None, lengths=lengths)

    return encode


def check_batch(got: TextConditioning, captions: list[str]) -> None:
    longest = max(len(c) for c in captions)
    assert got.hidden.shape == (len(captions), longest, WIDTH)
    assert got.lengths.tolist() == [len(c) for c in captions]
    for i, caption in enumerate(captions):
        torch.testing.assert_close(got.hidden[i, : len(caption)], states(caption), rtol=0, atol=0)
        assert not got.hidden[i, len(caption) :].any()  # padding is zeros


def test_rows_keep_their_own_lengths_in_memory():
    calls: list = []
    encode = ragged_encode(calls)
    cache = TextEncoderCache("id", to_disk=False)
    cache.prefill(["ab", "abcdef"], None, encode, batch_size=2)
    # a batch mixing rows of two encode calls (the second pads to another length)
    captions = ["abcdef", "xyz", "ab", "xyz"]
    check_batch(cache.get(captions, None, encode), captions)
    assert calls == [["ab", "abcdef"], ["xyz"]]
    assert cache._memory["ab"][0].shape == (2, WIDTH)  # stored without padding


def test_rows_read_back_from_disk_with_their_lengths(tmp_path):
    calls: list = []
    first = TextEncoderCache("id", to_disk=True)
    captions = ["a", "abcd", "ab"]
    first.get(captions, [tmp_path] * 3, ragged_encode(calls))
    with safe_open(str(first.path(tmp_path, "a")), framework="pt") as file:
        assert file.get_tensor("hidden").shape == (1, WIDTH)
    second = TextEncoderCache("id", to_disk=True)
    check_batch(second.get(captions, [tmp_path] * 3, ragged_encode(calls)), captions)
    assert len(calls) == 1  # all read from the files


def test_equal_rows_are_stacked_without_lengths():
    def encode(captions):
        return TextConditioning(
            torch.stack([torch.full((4, WIDTH), float(len(c))) for c in captions])
        )

    cache = TextEncoderCache("id", to_disk=False)
    got = cache.get(["a", "bb", "a"], None, encode)
    assert got.lengths is None and got.hidden.shape == (3, 4, WIDTH)
    assert got.hidden[1].eq(2.0).all()
