"""encode_prompts against the tokenizer and text encoder called by hand."""

from __future__ import annotations

import pytest
import torch

from library.config.schema import ModelSection
from library.models.loader import load_components
from library.models.text import encode_prompts, tokenize


@pytest.fixture(scope="module")
def parts(tiny_model_dir):
    model = ModelSection(pretrained_model_name_or_path=str(tiny_model_dir))
    return load_components(model, torch.float32)


def test_shape_and_equality_with_direct_call(parts):
    captions = ["a red circle on a white background", "shape"]
    got = encode_prompts(parts.tokenizer, parts.text_encoder, captions, "cpu")
    hidden = parts.text_encoder.config.hidden_size
    assert got.shape == (2, 77, hidden)

    ids = parts.tokenizer(
        captions, padding="max_length", max_length=77, truncation=True, return_tensors="pt"
    ).input_ids
    with torch.no_grad():
        expected = parts.text_encoder(ids).last_hidden_state
    torch.testing.assert_close(got.detach(), expected, rtol=0, atol=0)
    assert not torch.equal(got[0], got[1])


def test_token_ids_bos_eos_padding_and_truncation(parts):
    tok = parts.tokenizer
    bos, eos = tok.convert_tokens_to_ids(["<|startoftext|>", "<|endoftext|>"])
    short, long = tokenize(tok, ["ab", "x" * 200])
    # The tiny tokenizer is character level: "ab" -> "a", "b</w>".
    assert short[:4].tolist() == [
        bos,
        tok.convert_tokens_to_ids("a"),
        tok.convert_tokens_to_ids("b</w>"),
        eos,
    ]
    assert short[4:].eq(tok.pad_token_id).all()
    assert long.shape == (77,) and long[0] == bos and long[-1] == eos


def test_gradients_reach_the_text_encoder(parts):
    # Text-encoder LoRA training relies on encode_prompts not detaching anything.
    weight = parts.text_encoder.get_input_embeddings().weight
    weight.requires_grad_(True)
    try:
        out = encode_prompts(parts.tokenizer, parts.text_encoder, ["a red circle"], "cpu")
        out.sum().backward()
        assert weight.grad is not None and weight.grad.abs().sum() > 0
    finally:
        weight.requires_grad_(False)
        weight.grad = None
