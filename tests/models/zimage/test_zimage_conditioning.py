"""Z-Image's caption conditioning against diffusers' ZImagePipeline.encode_prompt on the tiny
folder: the same tensors, bit for bit, for captions of different lengths."""

from __future__ import annotations

import torch

from library.models.families.zimage import conditioning
from tests.kits.zimage import kit as zimage_kit
from tests.kits.zimage.tiny_shapes import TINY_TEXT_WIDTH

CAPTIONS = [
    "a cat",
    "",
    "the thin red thing in a long caption, with commas, digits 1234 and more words than the rest",
    "混合 unicode é",
]


def pipeline_states(pipe, captions, **kwargs):
    states, negatives = pipe.encode_prompt(
        list(captions), do_classifier_free_guidance=False, **kwargs
    )
    assert negatives == []
    return states


def test_equal_to_pipeline_encode_prompt(zimage_pipe):
    with torch.no_grad():
        ours = conditioning.encode_captions(
            zimage_pipe.tokenizer, zimage_pipe.text_encoder, CAPTIONS
        )
        theirs = pipeline_states(zimage_pipe, CAPTIONS)
    assert len(ours) == len(theirs) == len(CAPTIONS)
    for a, b in zip(ours, theirs, strict=True):
        assert a.shape == b.shape and torch.equal(a, b)
    lengths = [len(s) for s in ours]
    assert len(set(lengths)) == len(CAPTIONS)  # every caption its own length
    assert all(s.shape[1] == TINY_TEXT_WIDTH for s in ours)
    # the empty caption keeps the template: <|im_start|> u s er \n <|im_end|> \n <|im_start|>
    # a s s i s t a n t \n with the tiny tokenizer
    assert lengths[1] == 18


def test_truncated_captions_equal_pipeline(zimage_pipe):
    with torch.no_grad():
        ours = conditioning.encode_captions(
            zimage_pipe.tokenizer, zimage_pipe.text_encoder, CAPTIONS, max_length=24
        )
        theirs = pipeline_states(zimage_pipe, CAPTIONS, max_sequence_length=24)
    assert [len(s) for s in ours] == [len(s) for s in theirs]
    assert max(len(s) for s in ours) == 24
    assert all(torch.equal(a, b) for a, b in zip(ours, theirs, strict=True))


def test_states_are_the_next_to_last_layer(zimage_pipe):
    ids, mask = conditioning.tokenize_captions(zimage_pipe.tokenizer, ["a cat"])
    assert ids.shape == mask.shape == (1, conditioning.MAX_LENGTH) and mask.dtype == torch.bool
    with torch.no_grad():
        (states,) = conditioning.encode_token_ids(zimage_pipe.text_encoder, ids, mask)
        out = zimage_pipe.text_encoder(
            input_ids=ids, attention_mask=mask, output_hidden_states=True
        )
    n = int(mask.sum())
    assert len(out.hidden_states) == zimage_pipe.text_encoder.config.num_hidden_layers + 1
    assert torch.equal(states, out.hidden_states[-2][0, :n])
    assert not torch.allclose(states, out.last_hidden_state[0, :n])


def test_chat_text_is_the_user_turn(zimage_pipe):
    text = conditioning.chat_text(zimage_pipe.tokenizer, "a cat")
    assert text == "<|im_start|>user\na cat<|im_end|>\n<|im_start|>assistant\n"


def test_pad_and_unpad_round_trip():
    states = [torch.randn(3, 4), torch.randn(5, 4), torch.randn(1, 4)]
    padded, lengths = conditioning.pad_caption_states(states)
    assert padded.shape == (3, 5, 4) and lengths.tolist() == [3, 5, 1]
    assert (padded[0, 3:] == 0).all()
    back = conditioning.unpad_caption_states(padded, lengths)
    assert all(torch.equal(a, b) for a, b in zip(back, states, strict=True))


def test_the_distributed_modes_captions_differ_in_length(zimage_pipe):
    """What makes Z-Image's distributed modes (kit.DISTRIBUTED) a proof of batching by
    TextConditioning.lengths: the captions they train on are four lengths, which the
    transformer pads to four lengths again (to multiples of 32)."""
    for mode in zimage_kit.DISTRIBUTED:
        assert mode.captions == zimage_kit.CAPTIONS
    ids, mask = conditioning.tokenize_captions(zimage_pipe.tokenizer, list(zimage_kit.CAPTIONS))
    lengths = mask.sum(dim=1).tolist()
    assert len(set(lengths)) == 4 and len({-(-n // 32) for n in lengths}) == 4, lengths
