"""Z-Image's caption conditioning against diffusers' ZImagePipeline.encode_prompt on the tiny
folder: the same tensors, bit for bit, for captions of different lengths."""

from __future__ import annotations

import torch

from library.models.families.zimage import conditioning
from library.models.text_encoders import qwen3
from tests.kits.zimage import kit as zimage_kit
from tests.kits.zimage.tiny_shapes import TINY_TEXT_WIDTH

CAPTIONS = [
    "a cat",
    "",
    "the thin red thing in a long caption, with commas, digits 1234 and more words than the rest",
    "混合 unicode é",
]


def encode_captions(pipe, captions, max_length=conditioning.MAX_LENGTH):
    """Our conditioning of ``captions`` as the pipeline's list: each row cut to its length."""
    text = conditioning.encode(pipe.tokenizer, pipe.text_encoder, captions, max_length)
    return [row[:n] for row, n in zip(text.hidden, text.lengths.tolist(), strict=True)]


def pipeline_states(pipe, captions, **kwargs):
    states, negatives = pipe.encode_prompt(
        list(captions), do_classifier_free_guidance=False, **kwargs
    )
    assert negatives == []
    return states


def test_equal_to_pipeline_encode_prompt(zimage_pipe):
    with torch.no_grad():
        ours = encode_captions(zimage_pipe, CAPTIONS)
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
        ours = encode_captions(zimage_pipe, CAPTIONS, max_length=24)
        theirs = pipeline_states(zimage_pipe, CAPTIONS, max_sequence_length=24)
    assert [len(s) for s in ours] == [len(s) for s in theirs]
    assert max(len(s) for s in ours) == 24
    assert all(torch.equal(a, b) for a, b in zip(ours, theirs, strict=True))


def test_states_are_the_next_to_last_layer(zimage_pipe):
    ids, mask = qwen3.tokenize(zimage_pipe.tokenizer, ["a cat"], conditioning.MAX_LENGTH, True)
    assert ids.shape == mask.shape == (1, conditioning.MAX_LENGTH) and mask.dtype == torch.bool
    with torch.no_grad():
        (states,) = encode_captions(zimage_pipe, ["a cat"])
        out = zimage_pipe.text_encoder(
            input_ids=ids, attention_mask=mask, output_hidden_states=True
        )
    n = int(mask.sum())
    assert len(out.hidden_states) == zimage_pipe.text_encoder.config.num_hidden_layers + 1
    assert torch.equal(states, out.hidden_states[-2][0, :n])
    assert not torch.allclose(states, out.last_hidden_state[0, :n])


def test_chat_text_is_the_user_turn(zimage_pipe):
    text = qwen3.chat_text(zimage_pipe.tokenizer, "a cat", thinking=True)
    assert text == "<|im_start|>user\na cat<|im_end|>\n<|im_start|>assistant\n"


def test_the_distributed_modes_captions_differ_in_length(zimage_pipe):
    """What makes Z-Image's distributed modes (kit.DISTRIBUTED) a proof of batching by
    TextConditioning.lengths: the captions they train on are four lengths, which the
    transformer pads to four lengths again (to multiples of 32)."""
    for mode in zimage_kit.DISTRIBUTED:
        assert mode.captions == zimage_kit.CAPTIONS
    ids, mask = qwen3.tokenize(
        zimage_pipe.tokenizer, list(zimage_kit.CAPTIONS), conditioning.MAX_LENGTH, True
    )
    lengths = mask.sum(dim=1).tolist()
    assert len(set(lengths)) == 4 and len({-(-n // 32) for n in lengths}) == 4, lengths
