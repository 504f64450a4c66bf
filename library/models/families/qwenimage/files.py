"""Qwen-Image (and its edit models) from the single files ComfyUI users have: the transformer
file (pretrained_model_name_or_path, musubi-tuner's --dit), the Qwen2.5-VL text encoder
([flow] text_encoder, --text_encoder) and the VAE ([model] vae, --vae), with the Qwen2.5-VL
tokenizer from tokenizer_path.

As Comfy-Org distributes them (Comfy-Org/Qwen-Image_ComfyUI and Qwen-Image-Edit_ComfyUI,
``split_files/``):

- ``diffusion_models/qwen_image_bf16.safetensors`` (also ``_fp8_e4m3fn``, and the edit
  releases' ``qwen_image_edit[_2509|_2511]_bf16``): the transformer in diffusers' own names
  (diffusers' single-file reader renames nothing), without a prefix; full checkpoints put it
  under ``model.diffusion_model.``. Plain fp8 weights are cast to the weight dtype; ComfyUI's
  scaled fp8 is refused by name;
- ``text_encoders/qwen_2.5_vl_7b.safetensors``: Qwen2_5_VLForConditionalGeneration in the
  transformers names of its release (``model.layers.*``, ``visual.*``, ``lm_head.weight``);
  files saved by current transformers (``model.language_model.*``, ``model.visual.*``) are read
  too;
- ``vae/qwen_image_vae.safetensors``: the VAE in Wan 2.1's names (library/models/wan_vae_keys.py); the VAE of a
  diffusers folder (``vae/diffusion_pytorch_model.safetensors``, diffusers' names) is read too.

Each file's config is the one in its header (``difftune.config.<part>``, which difftune's full
fine-tunes write) when it fits; else the transformer's sizes are read off its shapes and the
text encoder's and VAE's are the released ones. Every tensor's name and shape is checked
against the module it fills before any weight is read; a missing or misshapen tensor is
refused naming the file and the key as the file spells it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import torch

from library.config.flow_schema import FlowSection
from library.config.schema import ModelSection
from library.errors import ModelError
from library.models import shape_configs
from library.models.checkpoint_file import CheckpointFile
from library.models.families import wan_vae_file
from library.models.families.file_contents import looks_like, sample_keys
from library.models.families.file_plans import (
    Plan,
    family_component_file,
    load_plan,
    open_safetensors,
    plan_part,
    refuse_scaled_fp8,
)
from library.models.families.local_tokenizer import load_local_tokenizer
from library.models.families.qwenimage import shapes
from library.models.families.qwenimage.detect import detect_qwenimage
from library.models.families.wan_vae_file import stored_config
from library.models.loader import offline

FAMILY = "Qwen-Image"
CHECKPOINT_PREFIX = "model.diffusion_model."
# config key -> (its section, what it names) for messages
COMPONENT_FILES = {
    "text_encoder": ("[flow]", "the Qwen2.5-VL text encoder (qwen_2.5_vl_7b.safetensors)"),
    "vae": ("[model]", "the VAE (qwen_image_vae.safetensors)"),
}
TOKENIZER_WHERE = "a Qwen-Image diffusers folder's tokenizer/, or Qwen/Qwen-Image's"
_BLOCK = re.compile(r"(model\.diffusion_model\.)?transformer_blocks\.\d+\.")


@dataclass
class QwenImageFiles:
    """The modules and tokenizer read from the single files."""

    transformer: torch.nn.Module
    vae: torch.nn.Module
    text_encoder: torch.nn.Module
    tokenizer: object
    model_dir: Path  # the transformer file


def load_qwenimage_files(
    path: Path, model: ModelSection, flow: FlowSection, weight_dtype: torch.dtype,
    vae_dtype: torch.dtype, zero_cond_t: bool | None = None,
) -> QwenImageFiles:  # fmt: skip
    """The transformer file ``path`` with [flow] text_encoder, [model] vae and the
    tokenizer_path tokenizer; ``zero_cond_t``: the transformer's zero_cond_t as its release
    has it (None: as its header says, else off). ModelError for any problem, found before any
    weight is read."""
    if not path.is_file():
        raise ModelError(f"model file {path} does not exist; nothing is downloaded")
    plans = {
        "transformer": plan_transformer(
            open_safetensors(path, "pretrained_model_name_or_path", FAMILY), zero_cond_t
        ),
        "text_encoder": plan_text_encoder(component_file(flow.text_encoder, "text_encoder")),
        "vae": plan_vae(component_file(model.vae, "vae")),
    }
    check_caption_width(plans["transformer"], plans["text_encoder"])
    vocab = plans["text_encoder"].config["text_config"]["vocab_size"]
    tokenizer = load_local_tokenizer(
        model.tokenizer_path, vocab, path, "Qwen2.5-VL", TOKENIZER_WHERE
    )
    with offline():
        transformer, text_encoder = (
            load_plan(plans[p], weight_dtype) for p in ("transformer", "text_encoder")
        )
        vae = load_plan(plans["vae"], vae_dtype)
    return QwenImageFiles(transformer, vae, text_encoder, tokenizer, path)


def component_file(value: str | None, key: str) -> CheckpointFile:
    """The component file the config key ``key`` names (``value``), its header read; ModelError
    naming the key when unusable."""
    section, what = COMPONENT_FILES[key]
    return family_component_file(value, key, section, what, FAMILY)


# --- transformer ------------------------------------------------------------------------------


def plan_transformer(file: CheckpointFile, zero_cond_t: bool | None = None) -> Plan:
    """The transformer in diffusers' names, with or without ``model.diffusion_model.``."""
    what = "pretrained_model_name_or_path"
    refuse_scaled_fp8(file, what)
    if detect_qwenimage(file.keys()) is None:
        raise ModelError(
            f"{file.path} holds no Qwen-Image transformer ({sample_keys(file.keys())}); point "
            "pretrained_model_name_or_path at qwen_image_bf16.safetensors or a diffusers folder"
        )
    prefixed = any(k.startswith(CHECKPOINT_PREFIX) for k in file)
    prefix = CHECKPOINT_PREFIX if prefixed else ""
    keys = [k for k in file if k.startswith(prefix)]  # a full checkpoint's other parts: not ours

    def convert(state):
        return {k[len(prefix) :]: v for k, v in state.items()}

    def block(key: str) -> str:
        found = _BLOCK.match(key)
        return found.group(0) if found else ""

    fixed = None if zero_cond_t is None else {"zero_cond_t": zero_cond_t}
    return plan_part(
        "transformer", what, file, keys, convert, _build_transformer, transformer_config,
        lambda exc: ModelError(
            f"{what} = {file.path}: it lacks {prefix}{exc}, which the Qwen-Image transformer has;"
            " re-download or re-convert it"
        ), fixed=fixed, group=block, label="Qwen-Image transformer",
    )  # fmt: skip


def transformer_config(plain: Mapping[str, tuple[int, ...]]) -> dict:
    """QwenImageTransformer2DModel kwargs for diffusers-named shapes (KeyError naming a key the
    sizes are read from when it is missing). The rotary split of the head is not stored: the
    released one, or its proportions for another head width."""
    base = shapes.transformer_config()
    width, in_channels = plain["img_in.weight"]
    head_dim = plain["transformer_blocks.0.attn.norm_q.weight"][0]
    patch = base["patch_size"]
    layers = {int(m[1]) for k in plain if (m := re.match(r"transformer_blocks\.(\d+)\.", k))}
    config = {
        **base,
        "in_channels": in_channels,
        "out_channels": plain["proj_out.weight"][0] // (patch * patch),
        "num_layers": 1 + max(layers),
        "attention_head_dim": head_dim,
        "num_attention_heads": width // head_dim,
        "joint_attention_dim": plain["txt_in.weight"][1],
    }
    shape_configs.fitted_rotary_axes(config, head_dim, "Qwen-Image transformer")
    return config


def _build_transformer(config: dict) -> torch.nn.Module:
    from diffusers import QwenImageTransformer2DModel

    return QwenImageTransformer2DModel(**config)


# --- Qwen2.5-VL -------------------------------------------------------------------------------


def text_encoder_names(keys) -> dict[str, str]:
    """File key -> Qwen2_5_VLForConditionalGeneration's name, for either transformers layout
    (``model.layers.*`` and ``visual.*`` of the release, or current ``model.language_model.*``
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
            out[key] = key  # not a Qwen2.5-VL tensor: the fit check names it
    return out


def plan_text_encoder(file: CheckpointFile) -> Plan:
    """Qwen2.5-VL as Qwen2_5_VLForConditionalGeneration: the vision tower is read too (the edit
    models show it their reference images)."""
    what = "text_encoder"
    refuse_scaled_fp8(file, what)
    names = text_encoder_names(file.keys())
    embed = "model.language_model.embed_tokens.weight"
    if embed not in names.values() or not any("model.visual." in n for n in names.values()):
        raise ModelError(
            f"{what} = {file.path} is not {COMPONENT_FILES[what][1]}: it has no "
            f"{'model.embed_tokens.weight' if embed not in names.values() else 'visual.*'} "
            f"tensors (the file looks like {looks_like(file.keys())}); set {what} in [flow] "
            "to qwen_2.5_vl_7b.safetensors (bf16; its scaled fp8 file is not read)"
        )

    def convert(state):
        return {names[k]: v for k, v in state.items()}

    def released(plain) -> dict:
        # A header that does not fit stays the measure, so the error names the tensor that
        # differs from it; without one, the released sizes (and the file's vocabulary).
        config = stored_config(file, "text_encoder") or shapes.text_encoder_config()
        config["text_config"]["vocab_size"] = plain[embed][0]
        return config

    return plan_part(
        "text_encoder", what, file, list(file.keys()), convert, _build_qwen25vl, released,
        lambda exc: ModelError(f"{what} = {file.path}: it lacks {exc}; re-download it"),
        label="Qwen2.5-VL text encoder",
    )  # fmt: skip


def _build_qwen25vl(config: dict) -> torch.nn.Module:
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

    return Qwen2_5_VLForConditionalGeneration(Qwen2_5_VLConfig(**config))


def check_caption_width(transformer: Plan, text_encoder: Plan) -> None:
    """Qwen2.5-VL's states are as wide as the transformer's caption input."""
    width = text_encoder.config["text_config"]["hidden_size"]
    takes = transformer.config["joint_attention_dim"]
    if width != takes:
        raise ModelError(
            f"text_encoder = {text_encoder.file.path} is {width} wide and the transformer of "
            f"{transformer.file.path} takes {takes}-wide caption states; set text_encoder in "
            "[flow] to Qwen-Image's Qwen2.5-VL file (qwen_2.5_vl_7b.safetensors)"
        )


# --- VAE --------------------------------------------------------------------------------------


def plan_vae(file: CheckpointFile) -> Plan:
    """The VAE in Wan 2.1's names (ComfyUI's file) or diffusers' (a folder's vae/ file)."""
    return wan_vae_file.plan_vae(
        file, "vae", COMPONENT_FILES["vae"][1], shapes.vae_config, "Qwen-Image VAE"
    )
