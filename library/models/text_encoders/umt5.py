"""The umT5 text-encoder kind (google/umt5-xxl's encoder, transformers' UMT5EncoderModel): its
released config, its single file (Comfy-Org's umt5_xxl_*.safetensors, in transformers' names
as T5's files are: the shared T5 reader with umT5's module; or Wan-AI's
models_t5_umt5-xxl-enc-bf16.pth, the encoder in the names of Wan's own T5 code, renamed by
``WAN_BLOCK``), and captions -> states as
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
from library.models.families.file_plans import (
    T5_EMBED,
    T5_EMBED_ALIAS,
    Plan,
    plan_part,
    plan_t5_encoder,
    t5_config_from_shapes,
    wrong_file,
)
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


# Wan's T5 encoder (Wan-AI's wan/modules/t5.py, T5Encoder) -> UMT5EncoderModel: each block's
# stems (Wan's feed-forward is fc2(fc1(x) * gelu(gate(x))): gate is transformers' activated wi_0),
# and the top-level tensors.
WAN_BLOCK = {
    "norm1.weight": "layer.0.layer_norm.weight",
    **{f"attn.{p}.weight": f"layer.0.SelfAttention.{p}.weight" for p in "qkvo"},
    "pos_embedding.embedding.weight": "layer.0.SelfAttention.relative_attention_bias.weight",
    "norm2.weight": "layer.1.layer_norm.weight",
    "ffn.gate.0.weight": "layer.1.DenseReluDense.wi_0.weight",
    "ffn.fc1.weight": "layer.1.DenseReluDense.wi_1.weight",
    "ffn.fc2.weight": "layer.1.DenseReluDense.wo.weight",
}
WAN_TOP = {"token_embedding.weight": T5_EMBED, "norm.weight": "encoder.final_layer_norm.weight"}
WAN_MARK = "blocks.0.attn.q.weight"  # a key only Wan's layout has
_WAN_BLOCK_KEY = re.compile(r"blocks\.(\d+)\.(.+)")


def wan_t5_name(key: str) -> str:
    """UMT5EncoderModel's name of Wan's T5 encoder tensor ``key``; KeyError for another."""
    if key in WAN_TOP:
        return WAN_TOP[key]
    found = _WAN_BLOCK_KEY.fullmatch(key)
    if found is None or found[2] not in WAN_BLOCK:
        raise KeyError(key)
    return f"encoder.block.{found[1]}.{WAN_BLOCK[found[2]]}"


def from_wan_t5(state) -> dict:
    """Wan's T5 encoder tensors in UMT5EncoderModel's names (the embedding under both of its
    tied names)."""
    out = {wan_t5_name(k): v for k, v in state.items()}
    return out | {T5_EMBED_ALIAS: out[T5_EMBED]} if T5_EMBED in out else out


def plan_umt5_file(file: CheckpointFile, key: str, part: str, label: str) -> Plan:
    """umT5-XXL's encoder from the file ``key`` names, as ``part``, its config umT5-XXL's with
    the sizes its tensors show; in transformers' names or Wan's (WAN_BLOCK)."""
    expected = (
        "the umT5-XXL text encoder (umt5_xxl_fp16.safetensors, or Wan-AI's "
        "models_t5_umt5-xxl-enc-bf16.pth)"
    )

    def wrong(problem: str):
        return wrong_file(key, file, expected, problem)

    if WAN_MARK not in file:
        return plan_t5_encoder(
            file, key, "", part, label, umt5_xxl_config(), wrong, build=build_umt5
        )
    return plan_part(
        part, key, file, list(file.keys()), from_wan_t5, build_umt5,
        lambda shapes: t5_config_from_shapes(shapes, umt5_xxl_config()),
        lambda exc: wrong(f"it holds {exc}, which Wan's T5 encoder has no place for"),
        label=label, tied=True,
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
