"""A tiny Qwen2.5-VL-style tokenizer for offline tests of Qwen-Image's text path.

Qwen-Image's tokenizer/ folder is Qwen2.5-VL's (model_index.json names ``Qwen2Tokenizer``):
byte-level BPE with Qwen2's pre-tokenizer split and NFC normalisation, ``<|endoftext|>`` as its
pad token, the ChatML turn tokens ``<|im_start|>`` / ``<|im_end|>`` (the end of a turn is the
EOS) and the vision tokens, no BOS, right padding. The one written here has the same pipeline
and special tokens in the same roles with only the 256 byte tokens and a few merges. Qwen-Image
writes its prompt template itself, so no chat template is needed.
``transformers.AutoTokenizer.from_pretrained(folder)`` loads it offline; the files are the same
bytes on every run (tools/make_test_assets.py writes them under tests/assets/).
"""

from __future__ import annotations

import json
from pathlib import Path

from tests.kits.sd.tiny import _byte_alphabet

# Qwen2's pre-tokenizer pattern: contractions, letter runs with one leading non-letter, single
# digits, punctuation runs, newlines, spaces.
SPLIT = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"""
    r"""| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
)
ENDOFTEXT, IM_START, IM_END = "<|endoftext|>", "<|im_start|>", "<|im_end|>"
VISION = ("<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>")
SPECIAL = (ENDOFTEXT, IM_START, IM_END, *VISION)
# "Ġ" is the byte-level stand-in for a space; each merge's parts exist before it.
MERGES = (("Ġ", "a"), ("e", "s"), ("Ġ", "t"), ("h", "e"), ("Ġt", "he"), ("o", "r"))


def tiny_vocab() -> dict[str, int]:
    """token -> id: the byte tokens, the merges' results, then the special tokens."""
    tokens = [*_byte_alphabet(), *(a + b for a, b in MERGES), *SPECIAL]
    return {token: i for i, token in enumerate(tokens)}


def _tokenizer_json() -> str:
    from tokenizers import (
        AddedToken,
        Regex,
        Tokenizer,
        decoders,
        normalizers,
        pre_tokenizers,
        processors,
    )
    from tokenizers.models import BPE

    base = {t: i for t, i in tiny_vocab().items() if t not in SPECIAL}
    tok = Tokenizer(BPE(vocab=base, merges=list(MERGES), fuse_unk=False, byte_fallback=False))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(SPLIT), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL])
    # The library's own formatting may change between versions: the files must not.
    return json.dumps(json.loads(tok.to_str()), indent=2, ensure_ascii=False) + "\n"


def _tokenizer_config() -> dict:
    vocab = tiny_vocab()
    added = {
        str(vocab[t]): {"content": t, "lstrip": False, "normalized": False, "rstrip": False,
                        "single_word": False, "special": True}
        for t in SPECIAL
    }  # fmt: skip
    return {
        "tokenizer_class": "Qwen2Tokenizer",
        "added_tokens_decoder": added,
        "bos_token": None,
        "eos_token": IM_END,
        "pad_token": ENDOFTEXT,
        "unk_token": None,
        "padding_side": "right",
        "add_prefix_space": False,
        "clean_up_tokenization_spaces": False,
        "errors": "replace",
        "split_special_tokens": False,
        "model_max_length": 131072,
    }


def write_tiny_qwen25vl_tokenizer(folder: str | Path) -> Path:
    """Write the tiny tokenizer (tokenizer.json, vocab.json, merges.txt, tokenizer_config.json)
    to ``folder``; returns ``folder``."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "tokenizer.json").write_text(_tokenizer_json(), encoding="utf-8")
    vocab = {t: i for t, i in tiny_vocab().items() if t not in SPECIAL}
    text = json.dumps(vocab, ensure_ascii=False, indent=2) + "\n"
    (folder / "vocab.json").write_text(text, encoding="utf-8")
    merges = ["#version: 0.2", *(f"{a} {b}" for a, b in MERGES)]
    (folder / "merges.txt").write_text("\n".join(merges) + "\n", encoding="utf-8")
    config = json.dumps(_tokenizer_config(), indent=2, ensure_ascii=False) + "\n"
    (folder / "tokenizer_config.json").write_text(config, encoding="utf-8")
    return folder
