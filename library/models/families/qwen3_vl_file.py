"""Qwen3-VL's single text-encoder file (Comfy-Org's qwen3vl_4b_bf16.safetensors, transformers'
names: ``model.language_model.*``, ``model.visual.*``, ``lm_head.weight``) planned as
transformers' ``Qwen3VLModel`` (language model and vision tower; the lm_head is left out), for
every family that reads Qwen3-VL's hidden states (library/models/text_encoders/qwen3_vl.py).
Its config is the header's (``difftune.config.<part>``) when there is one, else
Qwen3-VL-4B-Instruct's with the file's vocabulary."""

from __future__ import annotations

from library.errors import ModelError
from library.models.checkpoint_file import CheckpointFile
from library.models.families.file_contents import looks_like
from library.models.families.file_plans import Plan, plan_part, refuse_scaled_fp8
from library.models.families.wan_vae_file import stored_config

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
EMBED = "language_model.embed_tokens.weight"


def plan_qwen3_vl(file: CheckpointFile, what: str, description: str) -> Plan:
    """The file as Qwen3VLModel; ModelError naming ``what`` (the config key) and
    ``description`` (the file it should be) for a file that is not one."""
    refuse_scaled_fp8(file, what)
    keys = [k for k in file if not k.startswith("lm_head.")]
    names = {k: k.removeprefix("model.") for k in keys}
    if EMBED not in names.values():
        raise ModelError(
            f"{what} = {file.path} is not {description}: it has no model.{EMBED} (the file "
            f"looks like {looks_like(file.keys())}); set {what} in [flow] to "
            "qwen3vl_4b_bf16.safetensors"
        )

    def released(plain) -> dict:
        config = stored_config(file, what) or dict(QWEN3VL_4B)
        config["text_config"] = {**config["text_config"], "vocab_size": plain[EMBED][0]}
        return config

    def misfit(exc):
        return ModelError(f"{what} = {file.path}: it lacks {exc}; re-download it")

    return plan_part(what, what, file, keys, lambda s: {names[k]: v for k, v in s.items()},
                     _build, released, misfit, label="Qwen3-VL text encoder")  # fmt: skip


def _build(config):
    from transformers import Qwen3VLConfig, Qwen3VLModel

    return Qwen3VLModel(Qwen3VLConfig(**config))
