"""Qwen3-VL read as stacked layer taps (library.models.text_encoders.qwen3_vl), against the
pipeline that reads it so: diffusers' Krea2Pipeline.get_text_hidden_states on a tiny Qwen3-VL."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from library.models.text_encoders.qwen3_vl import TappedQwen3VL, text_positions, unused_layers

ASSETS = Path(__file__).resolve().parents[2] / "assets"
LAYERS = (1, 2, 4)


def _encoder():
    from transformers import Qwen3VLConfig, Qwen3VLModel

    torch.manual_seed(0)
    text = dict(vocab_size=300, hidden_size=32, intermediate_size=64, num_hidden_layers=4,
                num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                rope_parameters={"rope_theta": 5e6, "rope_type": "default",
                                 "mrope_section": [2, 1, 1], "mrope_interleaved": True})  # fmt: skip
    vision = dict(depth=1, hidden_size=16, intermediate_size=32, num_heads=2, out_hidden_size=32,
                  deepstack_visual_indexes=[0], patch_size=4, num_position_embeddings=16)  # fmt: skip
    return Qwen3VLModel(Qwen3VLConfig(text_config=text, vision_config=vision)).eval()


@pytest.fixture(scope="module")
def parts():
    from diffusers import Krea2Pipeline
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(ASSETS / "qwen25vl_tokenizer"))
    encoder = _encoder()
    pipe = Krea2Pipeline(scheduler=None, vae=None, text_encoder=encoder, tokenizer=tokenizer,
                         transformer=None, text_encoder_select_layers=LAYERS)  # fmt: skip
    taps = TappedQwen3VL(prefix=pipe.prompt_template_encode_prefix,
                         suffix=pipe.prompt_template_encode_suffix,
                         drop=pipe.prompt_template_encode_start_idx,
                         suffix_tokens=pipe.prompt_template_encode_num_suffix_tokens,
                         layers=LAYERS, max_tokens=40)  # fmt: skip
    return pipe, taps, tokenizer, encoder


def test_positions_count_only_real_tokens():
    mask = torch.tensor([[True, True, False, False, True]])
    assert text_positions(mask).tolist() == [[[0, 1, 1, 1, 2]]] * 3


def test_unused_layers_are_those_past_the_deepest_tap():
    assert list(unused_layers((2, 5, 35), 36)) == [35]
    assert list(unused_layers((0, 4), 4)) == []


@torch.no_grad()
def test_each_caption_keeps_the_pipelines_states_of_its_real_tokens(parts):
    pipe, taps, tokenizer, encoder = parts
    captions = ["a red cube", "the other one, a much longer caption on a gray table"]
    states, lengths = taps.encode(tokenizer, encoder, captions, "cpu")
    theirs, mask = pipe.get_text_hidden_states(captions, max_sequence_length=40, device="cpu")
    assert states.shape[2:] == (len(LAYERS), 32)
    for row, (n, want, keep) in enumerate(zip(lengths.tolist(), theirs, mask, strict=True)):
        assert n == int(keep.sum())
        torch.testing.assert_close(states[row, :n], want[keep], rtol=1e-5, atol=1e-6)
        assert not states[row, n:].any()  # zero padding at the end


@torch.no_grad()
def test_long_captions_are_cut_as_the_pipeline_cuts_them(parts):
    pipe, taps, tokenizer, encoder = parts
    caption = "word " * 60
    states, lengths = taps.encode(tokenizer, encoder, [caption], "cpu")
    theirs, mask = pipe.get_text_hidden_states([caption], max_sequence_length=40, device="cpu")
    assert int(lengths[0]) == int(mask.sum()) < len(caption.split())
    torch.testing.assert_close(states[0], theirs[0][mask[0]], rtol=1e-5, atol=1e-6)


def test_the_meta_device_gives_shapes_alone(parts):
    _, taps, tokenizer, _ = parts
    encoder = _encoder().to("meta")
    states, lengths = taps.encode(tokenizer, encoder, ["a cat"], "meta")
    assert states.device.type == "meta" and states.shape == (1, int(lengths[0]), 3, 32)
