"""Wan 2.1 I2V-14B's CLIP as Wan-AI ship it beside their transformers:
models_clip_open-clip-xlm-roberta-large-vit-huge-14.pth, the whole CLIP of Wan's own code
(wan/modules/clip.py: the visual tower ``visual.*`` beside the XLM-RoBERTa text tower
``textual.*``), whose visual tower is renamed here to transformers' CLIPVisionModel (its fused
``attn.to_qkv`` split into q, k, v; the text tower and the pooling head read past); a file in
transformers' names (Comfy-Org's clip_vision_h.safetensors) goes to the shared reader
(image_encoders/clip_vision_file.py)."""

from __future__ import annotations

import re

from library.models.checkpoint_file import CheckpointFile
from library.models.families.file_plans import Plan
from library.models.image_encoders.clip_vision_file import (
    plan_clip_vision,
    plan_clip_vision_file,
)

MARK = "visual.transformer.0.attn.to_qkv.weight"  # a key only Wan-AI's layout has
# Wan's visual tower -> CLIPVisionModel's names (whole keys, and each block's stems)
_TOP = {
    "visual.patch_embedding.weight": "embeddings.patch_embedding.weight",
    "visual.pos_embedding": "embeddings.position_embedding.weight",
    "visual.cls_embedding": "embeddings.class_embedding",
    **{f"visual.{o}.{p}": f"{d}.{p}" for o, d in (("pre_norm", "pre_layrnorm"),
       ("post_norm", "post_layernorm")) for p in ("weight", "bias")},
}  # fmt: skip
_BLOCK = {"norm1": "layer_norm1", "norm2": "layer_norm2", "attn.proj": "self_attn.out_proj",
          "mlp.0": "mlp.fc1", "mlp.2": "mlp.fc2"}  # fmt: skip
_BLOCK_KEY = re.compile(r"visual\.transformer\.(\d+)\.(.+)\.(weight|bias)")


def plan_clip_file(file: CheckpointFile, key: str, part: str, expected: str) -> Plan:
    """The CLIP vision tower from the file ``key`` names, in Wan's names or transformers'."""
    names = list(file.keys())
    if MARK not in names:
        return plan_clip_vision_file(file, key, part, expected)
    keys = [k for k in names if _from_wan(k) is not None]
    return plan_clip_vision(file, key, part, expected, keys, from_wan)


def _from_wan(key: str) -> str | tuple[str, ...] | None:
    """CLIPVisionModel's name of Wan's visual tower key (a fused q/k/v: its three), None for a
    key the tower does not read (the text tower, the pooling head)."""
    if key in _TOP:
        return _TOP[key]
    found = _BLOCK_KEY.fullmatch(key)
    if found is None:
        return None
    layer, stem, kind = found.groups()
    head = f"encoder.layers.{layer}"
    if stem == "attn.to_qkv":
        return tuple(f"{head}.self_attn.{p}_proj.{kind}" for p in "qkv")
    return f"{head}.{_BLOCK[stem]}.{kind}" if stem in _BLOCK else None


def from_wan(state) -> dict:
    """Wan's visual tower tensors in CLIPVisionModel's names (its class and position embeddings
    without Wan's leading unit dimensions)."""
    out = {}
    for key, value in state.items():
        name = _from_wan(key)
        if isinstance(name, tuple):
            out.update(zip(name, value.chunk(3), strict=True))
        elif key == "visual.cls_embedding":
            out[name] = value.reshape(-1)
        else:
            out[name] = value[0] if key == "visual.pos_embedding" else value
    return out
