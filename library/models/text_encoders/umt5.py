"""The umT5 text-encoder kind (google/umt5-xxl's encoder, transformers' UMT5EncoderModel): its
released config, its single file (Comfy-Org's umt5_xxl_*.safetensors, in transformers' names
as T5's files are: the shared T5 reader with umT5's module), and captions -> states as
diffusers' Wan pipelines make them: each caption cleaned (HTML entities, runs of whitespace),
tokenized to a fixed length with the end token, encoded with its padding mask, and every state
past the caption's own tokens set to zero. The tokenizer is T5's kind (text_encoders/t5.py:
umT5's tokenizer.json is a T5TokenizerFast's, pad 0 and end 1)."""

from __future__ import annotations

import html
import re
from collections.abc import Sequence

import torch

from library.models.checkpoint_file import CheckpointFile
from library.models.families.file_plans import Plan, plan_t5_encoder, wrong_file
from library.models.text_encoders.t5 import t5_states

MAX_TOKENS = 512  # the pipelines' max_sequence_length


def umt5_xxl_config() -> dict:
    """UMT5Config kwargs of umT5-XXL's encoder (google/umt5-xxl)."""
    return {
        "vocab_size": 256384, "d_model": 4096, "d_kv": 64, "d_ff": 10240, "num_layers": 24,
        "num_decoder_layers": 24, "num_heads": 64, "relative_attention_num_buckets": 32,
        "relative_attention_max_distance": 128, "feed_forward_proj": "gated-gelu",
        "dense_act_fn": "gelu_new", "layer_norm_epsilon": 1e-6, "tie_word_embeddings": False,
        "pad_token_id": 0, "eos_token_id": 1, "decoder_start_token_id": 0,
    }  # fmt: skip


def build_umt5(config: dict) -> torch.nn.Module:
    from transformers import UMT5Config, UMT5EncoderModel

    return UMT5EncoderModel(UMT5Config(**config))


def plan_umt5_file(file: CheckpointFile, key: str, part: str, label: str) -> Plan:
    """umT5-XXL's encoder from the file ``key`` names, as ``part``, its config umT5-XXL's with
    the sizes its tensors show."""
    expected = "the umT5-XXL text encoder (umt5_xxl_fp16.safetensors)"
    return plan_t5_encoder(
        file, key, "", part, label, umt5_xxl_config(),
        lambda problem: wrong_file(key, file, expected, problem), build=build_umt5,
    )  # fmt: skip


def clean_caption(text: str) -> str:
    """A caption as the pipelines clean it (without ftfy's repairs, which they apply only where
    ftfy is installed)."""
    return re.sub(r"\s+", " ", html.unescape(html.unescape(text)).strip()).strip()


def umt5_states(
    tokenizer, encoder, captions: Sequence[str], device, max_length: int = MAX_TOKENS
) -> tuple[torch.Tensor, torch.Tensor]:
    """(states [B, max_length, width] zero past each caption's tokens, the padding mask)."""
    cleaned = [clean_caption(c) for c in captions]
    states, mask = t5_states(tokenizer, encoder, cleaned, max_length, device)
    if states.is_meta:
        return states, mask
    return states * mask.unsqueeze(-1).to(states.dtype), mask
