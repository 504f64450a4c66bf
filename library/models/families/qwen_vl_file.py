"""Qwen's vision-language models as single text-encoder files (as Comfy-Org distributes them,
``text_encoders/``), planned for every family that reads one; each kind is its transformers
classes and released config (``QwenVLKind``):

- Qwen2.5-VL (``qwen_2.5_vl_7b.safetensors``): ``Qwen2_5_VLForConditionalGeneration`` in the
  names of its release (``model.layers.*``, ``visual.*``, ``lm_head.weight``); files saved by
  current transformers (``model.language_model.*``, ``model.visual.*``) are read too. Planned as
  the whole class, as a diffusers folder's text_encoder/ holds it (a family may show its vision
  tower images);
- Qwen3-VL (``qwen3vl_4b_bf16.safetensors``, current transformers' names) planned as
  ``Qwen3VLModel``: the language model and the vision tower, the lm_head left out
  (library/models/text_encoders/qwen3_vl.py reads its hidden states).

A file's config is its header's (``difftune.config.<part>``) when there is one, else the kind's
released one with the file's vocabulary. A file without the language model's embedding or the
vision tower is named as the wrong file; every tensor's name and shape is checked against the
module before any weight is read."""

from __future__ import annotations

import copy
import functools
from collections.abc import Mapping
from dataclasses import dataclass

import torch

from library.errors import ModelError
from library.models.checkpoint_file import CheckpointFile
from library.models.families.file_contents import looks_like
from library.models.families.file_plans import Plan, plan_part
from library.models.families.spec import ComponentFile, SpecPart
from library.models.families.wan_vae_file import stored_config

# Qwen2.5-VL-7B-Instruct's config ([hub] its config.json, Qwen2_5_VLForConditionalGeneration);
# pipelines run its language model on text alone, or show the vision tower images
QWEN25VL_7B = {
    "text_config": {
        "vocab_size": 152064,
        "hidden_size": 3584,
        "intermediate_size": 18944,
        "num_hidden_layers": 28,
        "num_attention_heads": 28,
        "num_key_value_heads": 4,
        "hidden_act": "silu",
        "max_position_embeddings": 128000,
        "rms_norm_eps": 1e-6,
        "rope_parameters": {
            "rope_type": "default",
            "rope_theta": 1000000.0,
            "mrope_section": [16, 24, 24],
        },
    },
    "vision_config": {
        "depth": 32,
        "hidden_size": 1280,
        "intermediate_size": 3420,
        "num_heads": 16,
        "out_hidden_size": 3584,
        "patch_size": 14,
        "spatial_merge_size": 2,
        "temporal_patch_size": 2,
        "window_size": 112,
        "fullatt_block_indexes": [7, 15, 23, 31],
        "tokens_per_second": 2,
    },
}
# Qwen3-VL-4B-Instruct's config ([hub] Qwen/Qwen3-VL-4B-Instruct config.json)
QWEN3VL_4B = {
    "text_config": {
        "vocab_size": 151936, "hidden_size": 2560, "intermediate_size": 9728,
        "num_hidden_layers": 36, "num_attention_heads": 32, "num_key_value_heads": 8,
        "head_dim": 128, "max_position_embeddings": 262144, "rms_norm_eps": 1e-6,
        "rope_parameters": {"rope_type": "default", "rope_theta": 5000000.0,
                            "mrope_section": [24, 20, 20], "mrope_interleaved": True},
    },
    "vision_config": {
        "depth": 24, "hidden_size": 1024, "intermediate_size": 4096, "num_heads": 16,
        "out_hidden_size": 2560, "deepstack_visual_indexes": [5, 11, 17],
    },
}  # fmt: skip


@dataclass(frozen=True)
class QwenVLKind:
    """One Qwen vision-language model read as a text encoder: its ``name`` in messages, the
    released file's name (``example``, with ``note`` after it in a fix), its transformers config
    and model classes, whether that model holds the LM head (a ForConditionalGeneration, whose
    names keep the ``model.`` head) and its ``released`` config."""

    name: str
    example: str
    config_class: str
    model_class: str
    with_head: bool
    released: Mapping
    note: str = ""


QWEN25_VL = QwenVLKind(
    "Qwen2.5-VL", "qwen_2.5_vl_7b.safetensors", "Qwen2_5_VLConfig",
    "Qwen2_5_VLForConditionalGeneration", True, QWEN25VL_7B,
    " (bf16, or its scaled fp8 file)",
)  # fmt: skip
QWEN3_VL = QwenVLKind(
    "Qwen3-VL", "qwen3vl_4b_bf16.safetensors", "Qwen3VLConfig", "Qwen3VLModel", False, QWEN3VL_4B
)


def current_names(keys) -> dict[str, str]:
    """File key -> its name in current transformers' ForConditionalGeneration, for either
    layout (``model.layers.*`` and ``visual.*`` of older releases, or ``model.language_model.*``
    and ``model.visual.*``)."""
    out = {}
    for key in keys:
        if key.startswith(("model.language_model.", "model.visual.", "lm_head.")):
            out[key] = key
        elif key.startswith("model."):
            out[key] = "model.language_model." + key[len("model.") :]
        elif key.startswith("visual."):
            out[key] = "model." + key
        else:
            out[key] = key  # not a Qwen-VL tensor: the fit check names it
    return out


def plan_qwen_vl(file: CheckpointFile, kind: QwenVLKind, what: str, description: str) -> Plan:
    """The file as ``kind``'s model; ModelError naming ``what`` (the config key) and
    ``description`` (the file it should be) for a file that is not one."""
    file.refuse_unreadable(what)
    names = current_names(file.keys())
    if not kind.with_head:  # a bare model's names are those inside model., and no LM head
        kept = {k: n for k, n in names.items() if not n.startswith("lm_head.")}
        names = {k: n.removeprefix("model.") for k, n in kept.items()}
    inner = "model." if kind.with_head else ""
    embed = f"{inner}language_model.embed_tokens.weight"
    missing = None
    if embed not in names.values():
        missing = "language model (embed_tokens.weight)"
    elif not any(n.startswith(f"{inner}visual.") for n in names.values()):
        missing = "vision tower (visual.*)"
    if missing:
        raise ModelError(
            f"{what} = {file.path} is not {description}: it has no {missing} (the file looks "
            f"like {looks_like(file.keys())}); set {what} in [flow] to {kind.example}{kind.note}"
        )

    def released(plain) -> dict:
        # A header that does not fit stays the measure, so the error names the tensor that
        # differs from it; without one, the released sizes (and the file's vocabulary).
        config = stored_config(file, what) or copy.deepcopy(dict(kind.released))
        config["text_config"] = {**config["text_config"], "vocab_size": plain[embed][0]}
        return config

    def misfit(exc):
        return ModelError(f"{what} = {file.path}: it lacks {exc}; re-download it")

    return plan_part(
        what, what, file, list(names), lambda s: {names[k]: v for k, v in s.items()},
        functools.partial(_build, kind), released, misfit, label=f"{kind.name} text encoder",
    )  # fmt: skip


def _build(kind: QwenVLKind, config: dict) -> torch.nn.Module:
    import transformers

    model_class = getattr(transformers, kind.model_class)
    return model_class(getattr(transformers, kind.config_class)(**config))


def text_encoder_part(kind: QwenVLKind, description: str) -> SpecPart:
    """A spec's text encoder of ``kind``: a folder's text_encoder/ as its model class, or the
    [flow] text_encoder file (``description``: the file it must be, for messages)."""
    plan = functools.partial(plan_qwen_vl, kind=kind, what="text_encoder", description=description)
    return SpecPart(
        "text_encoder", "text_encoder", f"transformers:{kind.model_class}",
        file=ComponentFile("text_encoder", "[flow]", description, plan),
    )  # fmt: skip
