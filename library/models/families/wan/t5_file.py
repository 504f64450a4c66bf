"""umT5-XXL as Wan-AI ship it beside their transformers: models_t5_umt5-xxl-enc-bf16.pth, a
torch file of the encoder in the names of Wan's own T5 code (wan/modules/t5.py's T5Encoder),
renamed here to transformers' UMT5EncoderModel; a file in transformers' names (Comfy-Org's
umt5_xxl_*.safetensors) goes to the shared umT5 reader (text_encoders/umt5.py)."""

from __future__ import annotations

import re

from library.models.checkpoint_file import CheckpointFile
from library.models.families.file_plans import (
    T5_EMBED,
    T5_EMBED_ALIAS,
    Plan,
    plan_part,
    t5_config_from_shapes,
    wrong_file,
)
from library.models.text_encoders.umt5 import build_umt5, plan_umt5_file, umt5_xxl_config

# Each block's stems, Wan's -> transformers': Wan's feed-forward is fc2(fc1(x) * gelu(gate(x))),
# so its gate is transformers' activated wi_0 and fc1 the linear wi_1.
BLOCK = {
    "norm1.weight": "layer.0.layer_norm.weight",
    **{f"attn.{p}.weight": f"layer.0.SelfAttention.{p}.weight" for p in "qkvo"},
    "pos_embedding.embedding.weight": "layer.0.SelfAttention.relative_attention_bias.weight",
    "norm2.weight": "layer.1.layer_norm.weight",
    "ffn.gate.0.weight": "layer.1.DenseReluDense.wi_0.weight",
    "ffn.fc1.weight": "layer.1.DenseReluDense.wi_1.weight",
    "ffn.fc2.weight": "layer.1.DenseReluDense.wo.weight",
}
TOP = {"token_embedding.weight": T5_EMBED, "norm.weight": "encoder.final_layer_norm.weight"}
MARK = "blocks.0.attn.q.weight"  # a key only Wan's layout has
_BLOCK_KEY = re.compile(r"blocks\.(\d+)\.(.+)")
EXPECTED = (
    "the umT5-XXL text encoder (umt5_xxl_fp16.safetensors, or Wan-AI's "
    "models_t5_umt5-xxl-enc-bf16.pth)"
)


def umt5_name(key: str) -> str:
    """UMT5EncoderModel's name of Wan's T5 encoder tensor ``key``; KeyError for another."""
    if key in TOP:
        return TOP[key]
    found = _BLOCK_KEY.fullmatch(key)
    if found is None or found[2] not in BLOCK:
        raise KeyError(key)
    return f"encoder.block.{found[1]}.{BLOCK[found[2]]}"


def to_umt5(state) -> dict:
    """Wan's T5 encoder tensors in UMT5EncoderModel's names (the embedding under both of its
    tied names)."""
    out = {umt5_name(k): v for k, v in state.items()}
    return out | {T5_EMBED_ALIAS: out[T5_EMBED]} if T5_EMBED in out else out


def plan_t5_file(file: CheckpointFile) -> Plan:
    """umT5-XXL's encoder from the file [flow] t5 names, in Wan's names or transformers', its
    config umT5-XXL's with the sizes its tensors show."""
    if MARK not in file:
        return plan_umt5_file(file, "t5", "text_encoder", "Wan text_encoder")
    return plan_part(
        "text_encoder", "t5", file, list(file.keys()), to_umt5, build_umt5,
        lambda shapes: t5_config_from_shapes(shapes, umt5_xxl_config()),
        lambda exc: wrong_file("t5", file, EXPECTED, f"it holds {exc}, which Wan's T5 encoder "
                               "has no place for"),
        label="Wan text_encoder", tied=True,
    )  # fmt: skip
