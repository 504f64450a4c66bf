"""CLIP's vision tower from one file (musubi-tuner's --clip): Comfy-Org's
clip_vision_h.safetensors holds transformers' CLIPVisionModelWithProjection in its own names
(``vision_model.*``, the projection ``visual_projection.weight`` besides, which the states do not
use), as ComfyUI's clip_vision loader reads it, or CLIPVisionModel's own bare names; a family
with a layout of its own renames it through plan_clip_vision. The config is the file's own,
else CLIP ViT-H/14's with the sizes its tensors show."""

from __future__ import annotations

import math
from collections.abc import Mapping

import torch

from library.models.checkpoint_file import CheckpointFile
from library.models.families.file_plans import Plan, plan_part, wrong_file
from library.models.families.name_table import count_numbered

# CLIP ViT-H/14's vision tower (Comfy-Org's clip_vision_h.safetensors, Wan 2.1 I2V's
# image_encoder/): what its shapes do not show
VIT_H = {
    "hidden_size": 1280, "intermediate_size": 5120, "num_hidden_layers": 32,
    "num_attention_heads": 16, "image_size": 224, "patch_size": 14, "projection_dim": 1024,
    "hidden_act": "gelu", "layer_norm_eps": 1e-5,
}  # fmt: skip
_HEAD_WIDTH = 80  # ViT-H's attention heads (the shapes do not show them)
_VISION = "vision_model."  # the tower's names in ComfyUI's files (transformers 4's modules)
_PATCHES = "embeddings.patch_embedding.weight"


def build_clip_vision(config: dict) -> torch.nn.Module:
    from transformers import CLIPVisionConfig, CLIPVisionModel

    return CLIPVisionModel(CLIPVisionConfig(**config))


def vision_config_from_shapes(shapes: Mapping[str, tuple[int, ...]]) -> dict:
    """CLIPVisionConfig kwargs from transformers-named shapes over ViT-H's (KeyError naming a
    key the sizes are read from)."""
    hidden, _, patch, _ = shapes[_PATCHES]
    positions = shapes["embeddings.position_embedding.weight"][0]
    return {
        **VIT_H, "hidden_size": hidden, "patch_size": patch,
        "image_size": patch * math.isqrt(positions - 1),
        "intermediate_size": shapes["encoder.layers.0.mlp.fc1.weight"][0],
        "num_hidden_layers": count_numbered(shapes, "encoder.layers"),
        "num_attention_heads": max(1, hidden // _HEAD_WIDTH),
    }  # fmt: skip


def plan_clip_vision_file(file: CheckpointFile, key: str, part: str, expected: str) -> Plan:
    """CLIP's vision tower from the file ``key`` names, in transformers' names under
    ``vision_model.`` (ComfyUI's clip_vision_*.safetensors: the tower and its projection, which
    the states do not use) or bare (CLIPVisionModel's own), as ``part``; its config the file's
    own, else ViT-H's with the sizes its tensors show."""
    names = list(file.keys())
    prefix = _VISION if _VISION + _PATCHES in names else ""
    if prefix + _PATCHES not in names:
        open_clip = any(k.startswith("visual.") for k in names)
        found = "open_clip's names (visual.*)" if open_clip else f"no {_VISION}{_PATCHES}"
        raise wrong_file(key, file, expected, f"it holds {found}")
    keys = [k for k in names if k.startswith(prefix) and not k.endswith("position_ids")
            and not k.startswith("visual_projection.")]  # fmt: skip

    def convert(state):
        return {k[len(prefix) :]: v for k, v in state.items()}

    return plan_clip_vision(file, key, part, expected, keys, convert)


def plan_clip_vision(file, key, part, expected, keys, convert) -> Plan:
    """The plan of CLIP's vision tower from ``keys`` of ``file`` renamed by ``convert`` to
    CLIPVisionModel's names (another layout's reader gives its own renaming)."""
    return plan_part(
        part, key, file, keys, convert, build_clip_vision, vision_config_from_shapes,
        lambda exc: wrong_file(key, file, expected, f"it lacks {exc}"), label="CLIP vision",
    )  # fmt: skip
