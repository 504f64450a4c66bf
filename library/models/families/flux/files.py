"""FLUX.1 from the single files users have: the transformer file (pretrained_model_name_or_path)
and the [flow] clip_l, t5xxl and ae files.

The transformer is read as Black Forest Labs and ComfyUI ship it (``double_blocks.*``, optionally
under ``model.diffusion_model.``) or in diffusers' names; clip_l in transformers' CLIPTextModel
names (with or without ``text_model.``), t5xxl in T5EncoderModel names, ae in BFL's
ae.safetensors names or diffusers' AutoencoderKL names. Each file's config is the one in its
metadata (``difftune.config.<part>``, written by difftune) when it fits, else the full-size FLUX.1
config with the sizes the tensors show (layer counts, widths), so pruned and tiny models load
too. Every file's header and shapes are checked, and the tokenizers found, before any weight is
read; weights stored in fp8, fp16 or bf16 are cast to the weight dtype on load.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from functools import partial
from pathlib import Path

import torch

from library.config.flow_schema import FlowSection
from library.config.schema import ModelSection
from library.errors import ModelError
from library.models import original_names as names
from library.models import shape_configs
from library.models.checkpoint_file import CheckpointFile
from library.models.families.file_contents import looks_like, sample_keys
from library.models.families.file_plans import (
    Plan,
    component_file,
    load_plan,
    open_safetensors,
    plan_autoencoder,
    plan_clip_encoder,
    plan_t5_encoder,
    plan_with_config,
    refuse_scaled_fp8,
)
from library.models.families.flux import shapes as flux_shapes
from library.models.families.flux.original_keys import (
    FluxKeys,
    ae_from_original,
    convert_shapes,
    detect_flux,
    transformer_from_original,
)
from library.models.families.flux.parts import FluxParts, refuse_channels
from library.models.families.flux.tokenizers import find_t5_tokenizer_folder, missing_t5_tokenizer
from library.models.loader import offline, one_line
from library.models.text_encoders.t5 import load_t5_tokenizer, located_t5_tokenizer
from library.models.tokenizers import load_tokenizer_for

_FLOW_FILES = {
    "clip_l": "the CLIP-L text encoder (clip_l.safetensors)",
    "t5xxl": "the T5-XXL text encoder (e.g. t5xxl_fp16.safetensors)",
    "ae": "the autoencoder (ae.safetensors)",
}


def load_flux_files(
    path: Path,
    model: ModelSection,
    flow: FlowSection,
    weight_dtype: torch.dtype,
    vae_dtype: torch.dtype,
) -> FluxParts:
    if not path.is_file():
        raise ModelError(f"model file {path} does not exist; nothing is downloaded")
    transformer_file = _open(path, "pretrained_model_name_or_path")
    found = detect_flux(transformer_file.keys())
    if found is None:
        raise ModelError(
            f"{path} holds no FLUX.1 transformer ({sample_keys(transformer_file.keys())}); point "
            "pretrained_model_name_or_path at flux1-dev/schnell.safetensors or a diffusers folder"
        )
    files = {key: _component_file(key, getattr(flow, key)) for key in _FLOW_FILES}
    plans = [
        plan_transformer(transformer_file, found),
        plan_clip(files["clip_l"]),
        plan_t5(files["t5xxl"]),
        plan_ae(files["ae"]),
    ]
    refuse_channels(path, plans[0].config["in_channels"])
    check_widths(
        path, plans[0].config, (f"clip_l = {files['clip_l'].path}", plans[1].config),
        (f"t5xxl = {files['t5xxl'].path}", plans[2].config),
    )  # fmt: skip
    t5_folder, t5_source = located_t5_tokenizer(
        find_t5_tokenizer_folder(flow.t5_tokenizer_path, model.tokenizer_cache_dir),
        flow.t5_tokenizer_path,
        model.tokenizer_cache_dir,
        missing_t5_tokenizer(flow.t5_tokenizer_path, path),
    )
    with offline():
        clip_tokenizer = load_tokenizer_for(
            "clip", 0, path, model.tokenizer_path, model.tokenizer_cache_dir, plans[1].config,
            "CLIP-L",
        )  # fmt: skip
        t5_tokenizer = load_t5_tokenizer(t5_folder, plans[2].config, t5_source)
        transformer, clip_l, t5 = (load_plan(p, weight_dtype) for p in plans[:3])
        vae = load_plan(plans[3], vae_dtype)
    return FluxParts(
        transformer, vae, clip_l, t5, clip_tokenizer, t5_tokenizer, found.variant, path
    )


def _open(path: Path, what: str) -> CheckpointFile:
    return open_safetensors(path, what, "FLUX.1")


def _component_file(key: str, value: str | None) -> CheckpointFile:
    """The [flow] file ``key`` names (``value``), its header read; ModelError naming the key
    when unusable."""
    if not value:
        raise ModelError(
            f"Flux.1 as a single transformer file needs {_FLOW_FILES[key]}: set {key} = "
            f'"<path to {key}.safetensors>" in [flow] (or use a diffusers folder)'
        )
    return component_file(key, value, _FLOW_FILES[key], "FLUX.1")


def plan_flow_file(key: str, value: str) -> Plan:
    """The plan of the [flow] clip_l, t5xxl or ae file ``key`` names (``value``), checked before
    any weight is read: with a diffusers folder it replaces the folder's part."""
    planners = {"clip_l": plan_clip, "t5xxl": plan_t5, "ae": plan_ae}
    return planners[key](_component_file(key, value))


def check_widths(
    where: Path, config: dict, clip: tuple[str, dict], t5: tuple[str, dict]
) -> None:
    """The encoders' outputs fit the transformer ``config`` (of ``where``): CLIP-L's pooled
    output its pooled projection, T5's states its text input. ``clip`` and ``t5`` are (how
    messages name the encoder, its config)."""
    checks = (
        (clip, "clip_l", "hidden_size", "pooled_projection_dim", "CLIP-L"),
        (t5, "t5xxl", "d_model", "joint_attention_dim", "T5-XXL"),
    )
    for (source, encoder), key, width, takes, name in checks:
        if encoder[width] != config[takes]:
            raise ModelError(
                f"{source} is {encoder[width]} wide and the transformer of {where} takes "
                f"{config[takes]}-wide {name} output; set {key} in [flow] to FLUX.1's {name} file"
            )


def _wrong_file(what: str, file: CheckpointFile, expected: str, problem: str) -> ModelError:
    return ModelError(
        f"{what} = {file.path} is not {expected}: {problem} (the file looks like "
        f"{looks_like(file.keys())}); set {what} in [flow] to {expected}'s file"
    )


# --- transformer --------------------------------------------------------------------------------


def plan_transformer(file: CheckpointFile, found: FluxKeys) -> Plan:
    what = "pretrained_model_name_or_path"
    refuse_scaled_fp8(file, what)
    # A ComfyUI-style checkpoint may hold other parts beside model.diffusion_model.*.
    keys = [k for k in file if k.startswith(found.prefix)]
    original = found.layout == "original"
    block_head = re.compile(re.escape(found.prefix) + r"(double_blocks|single_blocks)\.\d+\.")

    def block(key: str) -> str:
        # Each block's fused tensors with its own keys: linear1's split needs its weight's width.
        found_block = block_head.match(key)
        return found_block.group(0) if found_block else ""

    def convert(state):
        return transformer_from_original(state) if original else dict(state)

    def plan_of(config: dict) -> Plan:
        return Plan(
            "transformer", what, file, keys, config, convert, _build_transformer, group=block,
            label="FLUX.1 transformer",
        )  # fmt: skip

    def derive() -> dict:
        try:
            shapes = convert_shapes(convert, {k: file.shape(k) for k in keys})
        except ValueError as exc:
            raise ModelError(
                f"{file.path}: {one_line(exc)}; it is not a FLUX.1 transformer"
            ) from None
        return transformer_config_from_shapes(shapes, found)

    return plan_with_config("transformer", plan_of, file, derive)


def _build_transformer(config: dict) -> torch.nn.Module:
    from diffusers import FluxTransformer2DModel

    return FluxTransformer2DModel.from_config(config)


def transformer_config_from_shapes(shapes: Mapping[str, tuple[int, ...]], found: FluxKeys) -> dict:
    """FluxTransformer2DModel kwargs for diffusers-named shapes: the full-size config of the
    variant with the widths and block counts the tensors show.

    The rotary axes do not show in any shape: FLUX.1's (16, 56, 56) when they fit the head
    width, else a guess in the same proportions (with a warning).
    """
    base = flux_shapes.transformer_config(found.variant)
    width, in_channels = shapes["x_embedder.weight"]
    out_channels = shapes["proj_out.weight"][0]
    norm = next(v for k, v in shapes.items() if k.endswith(".attn.norm_q.weight"))
    head_dim = norm[0]
    config = {
        **base,
        "in_channels": in_channels,
        "out_channels": None if out_channels == in_channels else out_channels,
        "num_layers": found.double_blocks,
        "num_single_layers": found.single_blocks,
        "attention_head_dim": head_dim,
        "num_attention_heads": width // head_dim,
        "joint_attention_dim": shapes["context_embedder.weight"][1],
        "pooled_projection_dim": shapes["time_text_embed.text_embedder.linear_1.weight"][1],
    }
    shape_configs.fitted_rotary_axes(config, head_dim, "transformer")
    return config


# --- CLIP-L -------------------------------------------------------------------------------------

# Tensors of published clip_l files that CLIPTextModel does not have: transformers 4.x's
# position_ids buffer, the projection (FLUX.1 takes the pooled output without it), CLIP's logit
# scale.
_CLIP_UNUSED = ("position_ids", "text_projection.weight", "logit_scale")


def plan_clip(file: CheckpointFile) -> Plan:
    what, expected = "clip_l", "the CLIP-L text encoder"
    refuse_scaled_fp8(file, what)
    keys = [k for k in file if not k.endswith(_CLIP_UNUSED)]
    if not any(k.endswith("embeddings.token_embedding.weight") for k in keys):
        raise _wrong_file(what, file, expected, "it has no embeddings.token_embedding.weight")
    return plan_clip_encoder(
        file, what, keys, "text_encoder", "FLUX.1 text_encoder", flux_shapes.clip_l_config(),
        names.with_text_model_prefix, _build_clip, partial(_wrong_file, what, file, expected),
    )  # fmt: skip


def _build_clip(config: dict) -> torch.nn.Module:
    from transformers import CLIPTextConfig, CLIPTextModel

    return CLIPTextModel(CLIPTextConfig(**config))


# --- T5 -----------------------------------------------------------------------------------------


def plan_t5(file: CheckpointFile) -> Plan:
    what, expected = "t5xxl", "the T5-XXL text encoder"
    refuse_scaled_fp8(file, what)
    return plan_t5_encoder(
        file, what, "", "text_encoder_2", "FLUX.1 text_encoder_2", flux_shapes.t5_xxl_config(),
        partial(_wrong_file, what, file, expected),
    )  # fmt: skip


# --- AE -----------------------------------------------------------------------------------------


def plan_ae(file: CheckpointFile) -> Plan:
    return plan_autoencoder(
        file, "ae", ("first_stage_model.", "vae."), ae_from_original, flux_shapes.ae_config(),
        "FLUX.1 vae", (flux_shapes.LATENT_CHANNELS, "FLUX.1's"),
        partial(_wrong_file, "ae", file, "the FLUX.1 autoencoder"),
    )  # fmt: skip
