"""A tiny Qwen3-style tokenizer for offline tests of Z-Image's text path.

Z-Image's tokenizer/ folder is Qwen3's (model_index.json names ``Qwen2Tokenizer``): byte-level
BPE with Qwen2's pre-tokenizer split, NFC normalisation, the ChatML special tokens and a chat
template. The one written here has the same pipeline, the same special tokens in the same roles
(pad ``<|endoftext|>``, end of turn ``<|im_end|>``, no BOS) and a chat template that formats user
turns and the generation prompt exactly as Qwen3's does, with only 256 byte tokens and a few
merges, so the files stay small. ``transformers.AutoTokenizer.from_pretrained(folder)`` loads it
offline; the files are byte-identical on every run.
"""

from __future__ import annotations

import json
from pathlib import Path

from tests.kits.sd.tiny import _byte_alphabet

# Qwen2's pre-tokenizer pattern (transformers' tokenization_qwen2.PRETOKENIZE_REGEX): contractions,
# letter runs with one leading non-letter, single digits, punctuation runs, newlines, spaces.
PRETOKENIZE_REGEX = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"""
    r"""| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
)

PAD = "<|endoftext|>"  # Qwen's pad (and unknown-role) token
IM_START, IM_END = "<|im_start|>", "<|im_end|>"  # ChatML turn delimiters; IM_END is the EOS
THINK_START, THINK_END = "<think>", "</think>"  # Qwen3's reasoning tags: added, not special
SPECIAL = (PAD, IM_START, IM_END)

# A few merges so BPE really merges ("Ġ" is the byte-level stand-in for a space); each merge's
# parts exist before it.
MERGES = (("t", "h"), ("Ġ", "a"), ("i", "n"), ("Ġ", "th"), ("e", "r"), ("o", "n"))

# Qwen3's chat template produces, for each message, "<|im_start|>{role}\n{content}<|im_end|>\n"
# and, with add_generation_prompt, "<|im_start|>assistant\n" followed by an empty think block
# only when enable_thinking is false. This template writes the same text for plain-text
# messages (no tools, no reasoning content), which is all Z-Image sends.
CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}"
    "{{- '<|im_start|>assistant\\n' -}}"
    "{%- if enable_thinking is defined and enable_thinking is false -%}"
    "{{- '<think>\\n\\n</think>\\n\\n' -}}"
    "{%- endif -%}"
    "{%- endif -%}"
)
MODEL_MAX_LENGTH = 131072  # Qwen3's tokenizer_config.json value (the tokenizer-side cap)


def tiny_qwen3_vocab() -> dict[str, int]:
    """token -> id: the 256 byte tokens, then the merges' results, then the added tokens."""
    tokens = [*_byte_alphabet(), *(a + b for a, b in MERGES), *SPECIAL, THINK_START, THINK_END]
    return {token: i for i, token in enumerate(tokens)}


def tiny_qwen3_vocab_size() -> int:
    """Tokens of the tiny tokenizer, added tokens included."""
    return len(tiny_qwen3_vocab())


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

    vocab = tiny_qwen3_vocab()
    base = {t: i for t, i in vocab.items() if t not in (*SPECIAL, THINK_START, THINK_END)}
    tok = Tokenizer(
        BPE(
            vocab=base,
            merges=list(MERGES),
            continuing_subword_prefix="",
            end_of_word_suffix="",
            fuse_unk=False,
            byte_fallback=False,
        )
    )
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(PRETOKENIZE_REGEX), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL])
    tok.add_tokens(
        [AddedToken(t, special=False, normalized=False) for t in (THINK_START, THINK_END)]
    )
    # Fixed formatting: the committed files must not depend on the library's pretty-printer.
    return json.dumps(json.loads(tok.to_str()), indent=2, ensure_ascii=False) + "\n"


def _tokenizer_config() -> dict:
    vocab = tiny_qwen3_vocab()
    added = {
        str(vocab[t]): {
            "content": t,
            "lstrip": False,
            "normalized": False,
            "rstrip": False,
            "single_word": False,
            "special": t in SPECIAL,
        }
        for t in (*SPECIAL, THINK_START, THINK_END)
    }
    return {
        "tokenizer_class": "Qwen2Tokenizer",
        "added_tokens_decoder": added,
        "bos_token": None,
        "eos_token": IM_END,
        "pad_token": PAD,
        "unk_token": None,
        "add_prefix_space": False,
        "clean_up_tokenization_spaces": False,
        "errors": "replace",
        "split_special_tokens": False,
        "model_max_length": MODEL_MAX_LENGTH,
        "chat_template": CHAT_TEMPLATE,
    }


def write_tiny_qwen3_tokenizer(folder: str | Path) -> Path:
    """Write the tiny tokenizer (tokenizer.json, vocab.json, merges.txt, tokenizer_config.json)
    to ``folder``, the files Z-Image's tokenizer/ folder has; returns ``folder``."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "tokenizer.json").write_text(_tokenizer_json(), encoding="utf-8")
    vocab = {t: i for t, i in tiny_qwen3_vocab().items() if i < 256 + len(MERGES)}
    vocab_text = json.dumps(vocab, ensure_ascii=False, indent=2) + "\n"
    (folder / "vocab.json").write_text(vocab_text, encoding="utf-8")
    merges = ["#version: 0.2", *(f"{a} {b}" for a, b in MERGES)]
    (folder / "merges.txt").write_text("\n".join(merges) + "\n", encoding="utf-8")
    config = json.dumps(_tokenizer_config(), indent=2, ensure_ascii=False) + "\n"
    (folder / "tokenizer_config.json").write_text(config, encoding="utf-8")
    return folder
