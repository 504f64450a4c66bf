"""Long prompts (max_token_length 150/225) against windows built and encoded one by one by hand.

The expected values never go through library.models.text's windowing: each window's 77 token
ids are written out from the rule (BOS, the window's tokens, EOS where the text ends or is cut,
then padding; an empty window reads as the empty prompt), every window is encoded by its own
plain encoder call, and the states are joined as BOS + 75 per window + the last final state.
"""

from __future__ import annotations

import pytest
import torch
from transformers import CLIPTokenizer

from library.config.schema import ModelSection
from library.models.conditioning import encode_conditioning, encode_text
from library.models.loader import load_components
from library.models.text import encode_prompts, tokenize

CAPTIONS = ["a red circle on a white background", "x" * 100, "y" * 240]


@pytest.fixture(scope="module")
def sd1(tiny_model_dir):
    model = ModelSection(pretrained_model_name_or_path=str(tiny_model_dir))
    return load_components(model, torch.float32)


@pytest.fixture(scope="module")
def sd2(tiny_sd2v_model_dir):
    model = ModelSection(pretrained_model_name_or_path=str(tiny_sd2v_model_dir))
    parts = load_components(model, torch.float32)
    # SD 2.x's tokenizer pads with "!" rather than EOS.
    bang = CLIPTokenizer.from_pretrained(tiny_sd2v_model_dir / "tokenizer", pad_token="!")
    return parts, bang


@pytest.fixture(scope="module")
def sdxl(tiny_sdxl_model_dir):
    model = ModelSection(pretrained_model_name_or_path=str(tiny_sdxl_model_dir))
    parts = load_components(model, torch.float32)
    # SDXL's second tokenizer pads with "!", its first with EOS.
    bang = CLIPTokenizer.from_pretrained(tiny_sdxl_model_dir / "tokenizer_2", pad_token="!")
    return parts, (parts.tokenizer, bang)


def hand_windows(tok, caption: str, windows: int) -> list[list[int]]:
    """The 77-token ids of each window, written out from the rule."""
    bos, eos, pad = tok.bos_token_id, tok.eos_token_id, tok.pad_token_id
    content = tok(caption).input_ids[1:-1][: 75 * windows]
    out = []
    for k in range(windows):
        chunk = content[75 * k : 75 * (k + 1)]
        if not chunk:
            seq = [bos, eos] + [pad] * 75  # the empty prompt
        elif len(chunk) < 75:
            seq = [bos, *chunk, eos] + [pad] * (75 - len(chunk))
        else:
            seq = [bos, *chunk, eos]  # text runs to the window's end: EOS closes it
        assert len(seq) == 77
        out.append(seq)
    return out


def hand_join(states: list[torch.Tensor]) -> torch.Tensor:
    """Per-window [77, C] states -> [2 + 75n, C]."""
    parts = [states[0][:1]] + [s[1:76] for s in states] + [states[-1][76:]]
    return torch.cat(parts)


def hand_encode(encoder, tok, captions, windows, layer=None, norm=False) -> torch.Tensor:
    """Each window of each caption through its own encoder call, joined by hand."""
    rows = []
    for caption in captions:
        states = []
        for seq in hand_windows(tok, caption, windows):
            out = encoder(torch.tensor([seq]), output_hidden_states=True)
            state = out.last_hidden_state if layer is None else out.hidden_states[layer]
            if norm:
                state = getattr(encoder, "text_model", encoder).final_layer_norm(state)
            states.append(state[0])
        rows.append(hand_join(states))
    return torch.stack(rows)


@torch.no_grad()
def test_75_is_todays_encoding_bit_for_bit(sd1, sdxl):
    plain = encode_prompts(sd1.tokenizer, sd1.text_encoder, CAPTIONS, "cpu")
    at_75 = encode_prompts(sd1.tokenizer, sd1.text_encoder, CAPTIONS, "cpu", max_token_length=75)
    assert plain.shape == (3, 77, 32)
    assert torch.equal(plain, at_75)
    assert torch.equal(tokenize(sd1.tokenizer, CAPTIONS), tokenize(sd1.tokenizer, CAPTIONS, 75))
    parts, tokenizers = sdxl
    sizes = {"original_sizes": torch.tensor([[64, 64]] * 3)}
    sizes |= {"crop_top_lefts": torch.zeros(3, 2), "target_sizes": torch.tensor([[64, 64]] * 3)}
    a = encode_conditioning(parts.family, tokenizers, parts.text_encoders, CAPTIONS, "cpu", sizes)
    b = encode_conditioning(
        parts.family, tokenizers, parts.text_encoders, CAPTIONS, "cpu", sizes, max_token_length=75
    )
    assert torch.equal(a.encoder_hidden_states, b.encoder_hidden_states)
    added_a, added_b = a.unet_kwargs["added_cond_kwargs"], b.unet_kwargs["added_cond_kwargs"]
    assert all(torch.equal(added_a[k], added_b[k]) for k in ("text_embeds", "time_ids"))


@pytest.mark.parametrize("length", [150, 225])
@torch.no_grad()
def test_sd1_windows_equal_hand_assembly(sd1, length):
    windows = length // 75
    got = encode_prompts(sd1.tokenizer, sd1.text_encoder, CAPTIONS, "cpu", max_token_length=length)
    expected = hand_encode(sd1.text_encoder, sd1.tokenizer, CAPTIONS, windows)
    assert got.shape == (3, 2 + 75 * windows, 32)
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-6)


@torch.no_grad()
def test_clip_skip_applies_per_window(sd1):
    got = encode_prompts(sd1.tokenizer, sd1.text_encoder, CAPTIONS, "cpu", 2, max_token_length=150)
    expected = hand_encode(sd1.text_encoder, sd1.tokenizer, CAPTIONS, 2, layer=-2, norm=True)
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-6)
    plain = encode_prompts(sd1.tokenizer, sd1.text_encoder, CAPTIONS, "cpu", max_token_length=150)
    assert (got - plain).abs().max() > 1e-3


@pytest.mark.parametrize("length", [150, 225])
@torch.no_grad()
def test_sd2_bang_padding_windows(sd2, length):
    parts, bang = sd2
    windows = length // 75
    # 75 tokens exactly: window 0 is closed by EOS, window 1 is the empty prompt.
    captions = [*CAPTIONS, "z" * 75]
    got = encode_prompts(bang, parts.text_encoder, captions, "cpu", max_token_length=length)
    expected = hand_encode(parts.text_encoder, bang, captions, windows)
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-6)
    ids = tokenize(bang, captions, length)
    assert ids.shape == (4, windows, 77)
    assert ids[3, 0, -1] == bang.eos_token_id and ids[3, 0, -2] != bang.eos_token_id
    assert ids[0, 1, :3].tolist() == [bang.bos_token_id, bang.eos_token_id, bang.pad_token_id]


@pytest.mark.parametrize("tokenizer_kind", ["eos", "bang"])
@torch.no_grad()
def test_short_prompt_second_window_is_the_empty_prompt(sd1, sd2, tokenizer_kind):
    if tokenizer_kind == "eos":
        tok, encoder = sd1.tokenizer, sd1.text_encoder
    else:
        tok, encoder = sd2[1], sd2[0].text_encoder
    got = encode_prompts(tok, encoder, ["a cat"], "cpu", max_token_length=150)
    empty_ids = tok([""], padding="max_length", max_length=77, return_tensors="pt").input_ids
    empty = encoder(empty_ids).last_hidden_state[0]
    torch.testing.assert_close(got[0, 76:151], empty[1:76], rtol=0, atol=1e-6)
    torch.testing.assert_close(got[0, 151], empty[76], rtol=0, atol=1e-6)
    # The first window is the short prompt's own 77-token encoding.
    alone = encode_prompts(tok, encoder, ["a cat"], "cpu")
    torch.testing.assert_close(got[0, :76], alone[0, :76], rtol=0, atol=1e-6)


@pytest.mark.parametrize("length", [150, 225])
@torch.no_grad()
def test_sdxl_hidden_and_pooled_from_window_zero(sdxl, length):
    parts, tokenizers = sdxl
    windows = length // 75
    text = encode_text(
        parts.family, tokenizers, parts.text_encoders, CAPTIONS, "cpu", max_token_length=length
    )
    first = hand_encode(parts.text_encoder, tokenizers[0], CAPTIONS, windows, layer=-2)
    second = hand_encode(parts.text_encoders[1], tokenizers[1], CAPTIONS, windows, layer=-2)
    assert text.hidden.shape == (3, 2 + 75 * windows, 32 + 48)
    torch.testing.assert_close(text.hidden, torch.cat([first, second], -1), rtol=0, atol=1e-6)
    # Pooled: window 0's final-layer state at its first EOS, through the projection.
    pooled = []
    for caption in CAPTIONS:
        seq = hand_windows(tokenizers[1], caption, windows)[0]
        state = parts.text_encoders[1](torch.tensor([seq])).last_hidden_state[0]
        at_eos = state[seq.index(tokenizers[1].eos_token_id)]
        pooled.append(parts.text_encoders[1].text_projection(at_eos))
    torch.testing.assert_close(text.pooled, torch.stack(pooled), rtol=0, atol=1e-6)


def test_gradients_reach_every_window(sd1):
    weight = sd1.text_encoder.get_input_embeddings().weight
    weight.requires_grad_(True)
    try:
        out = encode_prompts(sd1.tokenizer, sd1.text_encoder, ["y" * 200], "cpu", None, 225)
        out[:, 151:226].sum().backward()  # window 2's content only
        y = sd1.tokenizer.convert_tokens_to_ids("y")
        assert weight.grad is not None and weight.grad[y].abs().sum() > 0
    finally:
        weight.requires_grad_(False)
        weight.grad = None


@pytest.mark.parametrize("bad", [0, 76, 100, 300, 77])
def test_other_lengths_are_refused(sd1, bad):
    with pytest.raises(ValueError, match="75, 150, 225"):
        tokenize(sd1.tokenizer, ["a"], bad)


@torch.no_grad()
def test_sdxl_ignores_clip_skip_as_sd_scripts_does(sdxl):
    """SDXL conditions on fixed layers: clip_skip = 2 gives exactly the conditioning of none."""
    parts, tokenizers = sdxl
    sizes = {"original_sizes": torch.tensor([[64, 64]] * 3)}
    sizes |= {"crop_top_lefts": torch.zeros(3, 2), "target_sizes": torch.tensor([[64, 64]] * 3)}
    plain = encode_conditioning(parts.family, tokenizers, parts.text_encoders, CAPTIONS, "cpu", sizes)
    skipped = encode_conditioning(
        parts.family, tokenizers, parts.text_encoders, CAPTIONS, "cpu", sizes, clip_skip=2
    )
    assert torch.equal(plain.encoder_hidden_states, skipped.encoder_hidden_states)
    assert torch.equal(plain.unet_kwargs["added_cond_kwargs"]["text_embeds"],
                       skipped.unet_kwargs["added_cond_kwargs"]["text_embeds"])
