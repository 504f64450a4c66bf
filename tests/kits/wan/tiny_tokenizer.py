"""A tiny umT5 tokenizer for offline tests of Wan's text path (run as a script to write one:
``python -m tests.kits.wan.tiny_tokenizer <folder>``).

umT5-XXL's tokenizer (google/umt5-xxl, a Wan folder's tokenizer/) is a SentencePiece unigram
T5TokenizerFast: pad 0, end of sequence 1, unknown 2, the end token after every caption, right
padding. The tiny T5 tokenizer (tests/kits/flux/tiny.py: one piece per printable character and
the word-start mark, tokenizer.json only, byte-identical on every run) has those roles, so it
is this one, with the pipelines' 512-token length."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from tests.kits.flux.tiny import tiny_t5_pieces, write_tiny_t5_tokenizer

MAX_LENGTH = 512


def tiny_umt5_vocab_size() -> int:
    return len(tiny_t5_pieces())


def write_tiny_umt5_tokenizer(folder: str | Path) -> Path:
    """Write the tiny tokenizer (tokenizer.json and configs) to ``folder``; returns it."""
    folder = write_tiny_t5_tokenizer(folder)
    config_file = folder / "tokenizer_config.json"
    config = json.loads(config_file.read_text(encoding="utf-8"))
    config["model_max_length"] = MAX_LENGTH
    config_file.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    return folder


if __name__ == "__main__":
    print(write_tiny_umt5_tokenizer(sys.argv[1]))
