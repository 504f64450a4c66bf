"""A tiny Qwen3-VL-style tokenizer for offline tests of Krea 2's text path.

Krea 2's tokenizer/ folder is Qwen3-VL-4B-Instruct's: byte-level BPE with Qwen2's pre-tokenizer
split, ``<|endoftext|>`` as its pad token, the ChatML turn tokens ``<|im_start|>`` /
``<|im_end|>`` and the vision tokens as special tokens, no BOS, right padding; the same roles
as Qwen2.5-VL's, which Qwen-Image's tiny tokenizer writes with 256 byte tokens and a few
merges. Krea 2 writes its prompt template itself (no chat template), so that tokenizer is this
one: ``write_tiny_qwen3vl_tokenizer`` writes it, byte-identical on every run, and
``transformers.AutoTokenizer.from_pretrained(folder)`` loads it offline.
"""

from __future__ import annotations

from pathlib import Path

from tests.kits.qwenimage.tiny_tokenizer import (
    tiny_vocab,
    write_tiny_qwen25vl_tokenizer,
)


def tiny_qwen3vl_vocab_size() -> int:
    """Tokens of the tiny tokenizer, special tokens included."""
    return len(tiny_vocab())


def write_tiny_qwen3vl_tokenizer(folder: str | Path) -> Path:
    """Write the tiny tokenizer (tokenizer.json, vocab.json, merges.txt, tokenizer_config.json)
    to ``folder``; returns ``folder``."""
    return write_tiny_qwen25vl_tokenizer(folder)
