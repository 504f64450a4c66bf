"""The committed tiny Qwen3 tokenizer: offline loading, the chat template and byte-level BPE
worked out by hand (tests/models/test_example_assets.py checks it against its generator)."""

from __future__ import annotations

import pytest

from tests.kits.zimage.tiny_tokenizer import tiny_qwen3_vocab, tiny_qwen3_vocab_size
from tools.make_test_assets import ASSETS_DIR

FOLDER = ASSETS_DIR / "qwen3_tokenizer"


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(FOLDER, local_files_only=True)


def test_loads_offline_as_qwen2_tokenizer_with_qwen_special_roles(tokenizer):
    vocab = tiny_qwen3_vocab()
    assert type(tokenizer).__name__ == "Qwen2Tokenizer"
    assert tokenizer.pad_token == "<|endoftext|>" and tokenizer.eos_token == "<|im_end|>"
    assert tokenizer.bos_token is None
    assert tokenizer.pad_token_id == vocab["<|endoftext|>"] == 262
    assert tokenizer.padding_side == "right"
    assert len(tokenizer) == tiny_qwen3_vocab_size() == 267
    for token in ("<|im_start|>", "<|im_end|>", "<|endoftext|>", "<think>", "</think>"):
        assert tokenizer(token)["input_ids"] == [vocab[token]], token


def test_chat_template_writes_qwen3_user_turn(tokenizer):
    messages = [{"role": "user", "content": "a red cat"}]
    thinking = tokenizer.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=True, enable_thinking=True
    )
    assert thinking == "<|im_start|>user\na red cat<|im_end|>\n<|im_start|>assistant\n"
    plain = tokenizer.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=True, enable_thinking=False
    )
    assert plain == thinking + "<think>\n\n</think>\n\n"
    no_prompt = tokenizer.apply_chat_template(messages, tokenize=False)
    assert no_prompt == "<|im_start|>user\na red cat<|im_end|>\n"


def test_byte_level_bpe_by_hand(tokenizer):
    from tokenizers import Tokenizer

    vocab = tiny_qwen3_vocab()
    # "the cat": "the" merges t+h; " cat" is Ġ c a t (no merge starts with Ġc).
    # "a thin": " thin" merges by rank: t+h, then i+n, then Ġ+th.
    cases = {
        "the cat": ["th", "e", "Ġ", "c", "a", "t"],
        "a thin": ["a", "Ġth", "in"],
        "é\n": ["Ã", "©", "Ċ"],  # UTF-8 bytes c3 a9, newline: GPT-2's byte stand-ins
    }
    file_tok = Tokenizer.from_file(str(FOLDER / "tokenizer.json"))
    for text, pieces in cases.items():
        ids = [vocab[p] for p in pieces]
        assert tokenizer(text)["input_ids"] == ids, text
        assert file_tok.encode(text).ids == ids, text
        assert tokenizer.decode(ids) == text


def test_pads_right_to_max_length_and_truncates(tokenizer):
    batch = tokenizer(["the cat", "a"], padding="max_length", max_length=8, truncation=True)
    assert batch["input_ids"][1] == [tiny_qwen3_vocab()["a"]] + [262] * 7
    assert batch["attention_mask"][0] == [1] * 6 + [0] * 2
    long = tokenizer(["x" * 20], padding="max_length", max_length=8, truncation=True)
    assert long["attention_mask"][0] == [1] * 8
