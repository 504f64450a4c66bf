"""Mistral 3's single text-encoder file planned as transformers' ``MistralModel``: the language
model alone, whose hidden states a family reads (library/models/text_encoders/mistral3.py).

The files: Comfy-Org's ``mistral_3_small_flux2_bf16.safetensors`` / ``_fp8`` (the language
model in Llama-style names under ``model.``: ``model.embed_tokens``, ``model.layers.<i>``,
``model.norm``; beside it the Pixtral ``vision_tower.*``, ``multi_modal_projector.*`` and
``tekken_model``, its tokenizer as bytes), and transformers' own names (``model.language_model.``
of a saved Mistral3ForConditionalGeneration, ``language_model.model.`` of Mistral's released
checkpoint). Only the language model is read: the vision tower, the projector, an LM head and
the tokenizer bytes stay in the file. Its config is the header's (``difftune.config.<part>``),
else Mistral Small 3.1's with the sizes the tensors show (the head width does not show: the
released 128).

ComfyUI also reads files cut after the deepest layer a pipeline reads (30 of 40 for FLUX.2
[dev]). transformers norms a model's last hidden state, so a model whose last layer is the
deepest one read is built to keep that state the layer's own output, as in the whole model.
"""

from __future__ import annotations

import torch

from library.errors import ModelError
from library.models.checkpoint_file import CheckpointFile
from library.models.families.file_contents import looks_like
from library.models.families.file_plans import (
    note_derived,
    plan_part,
    text_misfit,
)
from library.models.families.name_table import count_numbered
from library.models.plans import Plan
from library.models.released_configs import mistral_small_3_text_config

# Where the language model's keys start, the most specific first.
PREFIXES = ("model.language_model.", "language_model.model.", "model.", "")
_PARTS = ("embed_tokens.", "layers.", "norm.")  # MistralModel's own; all else stays unread
_MARK = "layers.0.self_attn.q_proj.weight"
_QK_NORM = "layers.0.self_attn.q_norm.weight"  # Qwen3's, which Mistral has not
LABEL = "Mistral 3 text encoder"


def mistral_config_from_shapes(plain, base: dict) -> dict:
    """MistralConfig kwargs for MistralModel-named shapes: ``base`` with every size the tensors
    show (the head width does not: ``base``'s); KeyError naming a missing key, ValueError when
    the queries or keys are no whole number of such heads."""
    vocab, hidden = plain["embed_tokens.weight"]
    head_dim = base["head_dim"]
    heads = {}
    for name, proj in (("num_attention_heads", "q_proj"), ("num_key_value_heads", "k_proj")):
        rows = plain[f"layers.0.self_attn.{proj}.weight"][0]
        if rows % head_dim or not rows:
            raise ValueError(f"{proj} has {rows} rows, no whole number of {head_dim}-wide heads")
        heads[name] = rows // head_dim
    return {
        **base,
        "vocab_size": vocab,
        "hidden_size": hidden,
        "intermediate_size": plain["layers.0.mlp.gate_proj.weight"][0],
        "num_hidden_layers": count_numbered(plain, "layers"),
        **heads,
    }


def plan_mistral3_file(
    file: CheckpointFile, key: str, expected: str, example: str, reads: int
) -> Plan:
    """The language model of the file ``key`` names ([flow]) as MistralModel; ``reads``: the
    deepest hidden state the family reads (a file with fewer layers is refused). ``expected``:
    what the file must hold, ``example``: its released file's name, as messages say them."""
    file.refuse_unreadable(key)
    prefix = next((p for p in PREFIXES if p + _MARK in file), None)
    if prefix is None or prefix + _QK_NORM in file:
        looks = "a Qwen3 text model" if prefix is not None else looks_like(file.keys())
        raise ModelError(
            f"{key} = {file.path} is not {expected}: it has no model.{_MARK} without q/k norms "
            f"(the file looks like {looks}); set {key} in [flow] to {example}"
        )
    keys = [k for k in file if k.startswith(prefix) and k[len(prefix) :].startswith(_PARTS)]
    layers = count_numbered((k[len(prefix) :] for k in keys), "layers")
    if layers < reads:
        raise ModelError(
            f"{key} = {file.path} holds {layers} decoder layers and the hidden states of layer "
            f"{reads} are read; set {key} in [flow] to the whole file ({example})"
        )
    base = mistral_small_3_text_config()

    def from_shapes(plain) -> dict:
        config = mistral_config_from_shapes(plain, base)
        # a file cut after the layers read is the released model still: only its sizes count
        note_derived(key, file, {**config, "num_hidden_layers": base["num_hidden_layers"]},
                     base, "head_dim")  # fmt: skip
        return config

    def build(config: dict) -> torch.nn.Module:
        from transformers import MistralConfig, MistralModel

        cut = {"tie_last_hidden_states": False} if config["num_hidden_layers"] <= reads else {}
        return MistralModel(MistralConfig(**{**config, **cut}))

    return plan_part(
        "text_encoder", key, file, keys,
        lambda state: {k[len(prefix) :]: v for k, v in state.items()}, build, from_shapes,
        text_misfit(key, file, prefix, LABEL), label=LABEL, file_name=lambda name: prefix + name,
    )  # fmt: skip
