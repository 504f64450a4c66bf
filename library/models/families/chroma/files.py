"""Chroma from the single files users have: the transformer file (pretrained_model_name_or_path)
and the [flow] t5xxl and ae files, with T5's tokenizer (t5_tokenizer_path).

The transformer is read as lodestones and ComfyUI ship it (original names, original_keys.py,
optionally under ``model.diffusion_model.``) or in diffusers' names; t5xxl and ae are FLUX.1's
files and are read by FLUX.1's readers (T5EncoderModel names; Black Forest Labs' ae.safetensors
names or diffusers'). The transformer's config is the one in its header
(``difftune.config.transformer``, written by difftune) when it fits, else the released config
with the sizes the tensors show. Every file's header and shapes are checked, and the tokenizer
found, before any weight is read.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path

import torch

from library.config.flow_schema import FlowSection
from library.config.schema import ModelSection
from library.errors import ModelError
from library.models import shape_configs
from library.models.checkpoint_file import CheckpointFile
from library.models.families.chroma.original_keys import detect_chroma, transformer_from_original
from library.models.families.chroma.shapes import transformer_config
from library.models.families.file_contents import sample_keys
from library.models.families.file_plans import (
    Plan,
    load_plan,
    open_safetensors,
    plan_with_config,
    refuse_scaled_fp8,
)
from library.models.families.flux.files import plan_ae, plan_t5
from library.models.families.flux.original_keys import convert_shapes
from library.models.families.flux.tokenizers import find_t5_tokenizer_folder, missing_t5_tokenizer
from library.models.loader import offline, one_line
from library.models.text_encoders.t5 import load_t5_tokenizer, located_t5_tokenizer

FLOW_FILES = {
    "t5xxl": "the T5-XXL text encoder (e.g. t5xxl_fp16.safetensors)",
    "ae": "the autoencoder (FLUX.1's ae.safetensors)",
}
_WHAT = "pretrained_model_name_or_path"


def load_chroma_files(
    path: Path, model: ModelSection, flow: FlowSection, weight_dtype, vae_dtype
) -> tuple:
    """(transformer, vae, t5, tokenizer) of a Chroma transformer file and its [flow] files."""
    if not path.is_file():
        raise ModelError(f"model file {path} does not exist; nothing is downloaded")
    file = open_safetensors(path, _WHAT, "Chroma")
    found = detect_chroma(file.keys())
    if found is None:
        raise ModelError(
            f"{path} holds no Chroma transformer ({sample_keys(file.keys())}); point "
            "pretrained_model_name_or_path at Chroma1-HD.safetensors or a diffusers folder"
        )
    files = {key: flow_file(flow, key) for key in FLOW_FILES}
    transformer_plan = plan_transformer(file, found)
    t5_plan, ae_plan = plan_t5(files["t5xxl"]), plan_ae(files["ae"])
    check_t5_width(path, transformer_plan.config, f"t5xxl = {files['t5xxl'].path}", t5_plan.config)
    folder, source = located_t5_tokenizer(
        find_t5_tokenizer_folder(flow.t5_tokenizer_path, model.tokenizer_cache_dir),
        flow.t5_tokenizer_path,
        model.tokenizer_cache_dir,
        missing_t5_tokenizer(flow.t5_tokenizer_path, path),
    )
    with offline():
        tokenizer = load_t5_tokenizer(folder, t5_plan.config, source)
        transformer, t5 = (
            load_plan(transformer_plan, weight_dtype),
            load_plan(t5_plan, weight_dtype),
        )
        vae = load_plan(ae_plan, vae_dtype)
    return transformer, vae, t5, tokenizer


def check_t5_width(where, config: Mapping, source: str, t5_config: Mapping) -> None:
    """T5's states are as wide as the transformer's text input."""
    width = {**transformer_config(), **config}["joint_attention_dim"]
    if t5_config["d_model"] != width:
        raise ModelError(
            f"{source} is {t5_config['d_model']} wide and the transformer of {where} takes "
            f"{width}-wide T5-XXL output; set t5xxl in [flow] to T5-XXL's file"
        )


def flow_file(flow: FlowSection, key: str) -> CheckpointFile:
    """The [flow] file ``key``, its header read; ModelError naming the key when unusable."""
    value = getattr(flow, key)
    if not value:
        raise ModelError(
            f"Chroma as a single transformer file needs {FLOW_FILES[key]}: set {key} = "
            f'"<path to {key}.safetensors>" in [flow] (or use a diffusers folder)'
        )
    path = Path(value).expanduser().absolute()
    if not path.is_file():
        raise ModelError(
            f"{key} = {path} is not a file; set {key} in [flow] to the .safetensors file of "
            f"{FLOW_FILES[key]}"
        )
    return open_safetensors(path, key, "Chroma")


def plan_transformer(file: CheckpointFile, found: tuple[str, str]) -> Plan:
    refuse_scaled_fp8(file, _WHAT)
    layout, prefix = found
    keys = [k for k in file if k.startswith(prefix)]  # a full checkpoint's other parts stay
    original = layout == "original"
    block_head = re.compile(re.escape(prefix) + r"(double_blocks|single_blocks)\.\d+\.")

    def block(key: str) -> str:
        head = block_head.match(key)
        return head.group(0) if head else ""

    def convert(state):
        return transformer_from_original(state) if original else dict(state)

    def plan_of(config: dict) -> Plan:
        return Plan(
            "transformer", _WHAT, file, keys, config, convert, _build_transformer, group=block,
            label="Chroma transformer",
        )  # fmt: skip

    def derive() -> dict:
        try:
            shapes = convert_shapes(convert, {k: file.shape(k) for k in keys})
            return transformer_config_from_shapes(shapes)
        except (KeyError, ValueError, StopIteration) as exc:
            raise ModelError(
                f"{file.path}: {one_line(exc)}; it is not a Chroma transformer"
            ) from None

    return plan_with_config("transformer", plan_of, file, derive)


def _build_transformer(config: dict) -> torch.nn.Module:
    from diffusers import ChromaTransformer2DModel

    return ChromaTransformer2DModel.from_config(config)


def _count(shapes: Mapping, head: str) -> int:
    pattern = re.compile(re.escape(head) + r"\.(\d+)\.")
    found = {int(m.group(1)) for k in shapes if (m := pattern.match(k))}
    return max(found) + 1 if found else 0


def transformer_config_from_shapes(shapes: Mapping[str, tuple[int, ...]]) -> dict:
    """ChromaTransformer2DModel kwargs for diffusers-named shapes: the released config with the
    widths and counts the tensors show. The rotary axes do not show: (16, 56, 56) when they fit
    the head width, else a guess in FLUX.1's proportions (with a warning)."""
    base = transformer_config()
    width, in_channels = shapes["x_embedder.weight"]
    out_channels = shapes["proj_out.weight"][0]
    head_dim = next(v for k, v in shapes.items() if k.endswith(".attn.norm_q.weight"))[0]
    hidden, channels = shapes["distilled_guidance_layer.in_proj.weight"]
    config = {
        **base,
        "in_channels": in_channels,
        "out_channels": None if out_channels == in_channels else out_channels,
        "num_layers": _count(shapes, "transformer_blocks"),
        "num_single_layers": _count(shapes, "single_transformer_blocks"),
        "attention_head_dim": head_dim,
        "num_attention_heads": width // head_dim,
        "joint_attention_dim": shapes["context_embedder.weight"][1],
        "approximator_num_channels": channels,
        "approximator_hidden_dim": hidden,
        "approximator_layers": _count(shapes, "distilled_guidance_layer.layers"),
    }
    if sum(base["axes_dims_rope"]) != head_dim:
        side = 2 * (head_dim * 7 // 32)
        config["axes_dims_rope"] = (head_dim - 2 * side, side, side)
        shape_configs.note_guesses("transformer", config, ("axes_dims_rope",))
    return config
