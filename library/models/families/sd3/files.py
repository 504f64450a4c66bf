"""SD3 / SD3.5 from the single files users have: Stability AI's model file
(pretrained_model_name_or_path) and the [flow] clip_l, clip_g and t5xxl files for the text
encoders it does not hold.

The model file is read as Stability AI ships it (sd3_medium.safetensors, sd3.5_medium /
sd3.5_large.safetensors, the ``_incl_clips...`` files): the MMDiT under ``model.diffusion_model.``
(or without the prefix, or a transformer file in diffusers' names), the VAE under
``first_stage_model.``, the text encoders under ``text_encoders.{clip_l,clip_g,t5xxl}.transformer.``
in transformers' names. A [flow] clip_l / clip_g / t5xxl file is used instead of the one inside;
a text encoder neither inside nor set is an error naming its key. The VAE is [model] ``vae`` when
set, else the one inside, else an error naming ``vae``.

Separate files: clip_l and clip_g in transformers' CLIPTextModelWithProjection names (with or
without ``text_model.``), t5xxl in T5EncoderModel names, a vae file in SD's LDM names or
diffusers' (with or without ``first_stage_model.``). The clip_l.safetensors Stability released
with SD3 has no text_projection.weight: CLIP-L then gets the identity projection, as Stability's
reference code and ComfyUI give it. Each file's config is the one in its metadata
(``difftune.config.<part>``, written by difftune) when it fits, else the full-size SD3 config with
the sizes the tensors show. Every file's header and shapes are checked, the encoders' widths
matched with the transformer's inputs and the tokenizers found, before any weight is read;
weights stored in fp8, fp16 or bf16 are cast to the weight dtype on load.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from pathlib import Path

import torch

from library.config.flow_section import FlowSection
from library.config.model_schema import ModelSection
from library.errors import ModelError
from library.models import original_names as names
from library.models.checkpoint_file import CheckpointFile
from library.models.families.file_contents import looks_like, sample_keys
from library.models.families.file_plans import (
    Plan,
    component_file,
    load_plan,
    open_safetensors,
    plan_autoencoder,
    plan_clip_encoder,
    plan_part,
    plan_t5_encoder,
    refuse_scaled_fp8,
)
from library.models.families.sd3 import shapes as sd3_shapes
from library.models.families.sd3.original_keys import (
    TEXT_ENCODER_PREFIXES,
    VAE_PREFIX,
    SD3Keys,
    ae_from_original,
    detect_sd3,
    transformer_config_from_shapes,
    transformer_from_original,
)
from library.models.families.sd3.parts import SD3Parts, refuse_channels
from library.models.families.sd3.tokenizers import (
    find_sd3_t5_tokenizer_folder,
    missing_t5_tokenizer,
)
from library.models.model_files import offline, one_line
from library.models.text_encoders.t5 import load_t5_tokenizer, located_t5_tokenizer
from library.models.tokenizers import load_tokenizer_for
from library.models.vae_file import load_vae

log = logging.getLogger(__name__)

MODEL_KEY = "pretrained_model_name_or_path"
FAMILY = "SD3"
# [flow] key -> (diffusers part, what the file must be, how errors name the module, base config)
_ENCODERS: dict[str, tuple[str, str, str, Callable[[], dict]]] = {
    "clip_l": (
        "text_encoder",
        "the CLIP-L text encoder (clip_l.safetensors)",
        "SD3 CLIP-L",
        sd3_shapes.clip_l_config,
    ),
    "clip_g": (
        "text_encoder_2",
        "the CLIP-G text encoder (clip_g.safetensors)",
        "SD3 CLIP-G",
        sd3_shapes.clip_g_config,
    ),
    "t5xxl": (
        "text_encoder_3",
        "the T5-XXL text encoder (e.g. t5xxl_fp16.safetensors)",
        "SD3 T5-XXL",
        sd3_shapes.t5_xxl_config,
    ),
}
_VAE = "the SD3 VAE (16 latent channels)"
# Where the [model] and [flow] keys live, for the fix an error names.
_SECTION = {"vae": "[model]", "clip_l": "[flow]", "clip_g": "[flow]", "t5xxl": "[flow]"}
# Tensors of published CLIP files that CLIPTextModelWithProjection does not have: transformers
# 4.x's position_ids buffer, CLIP's logit scale.
_CLIP_UNUSED = ("position_ids", "logit_scale")


def load_sd3_files(
    path: Path,
    model: ModelSection,
    flow: FlowSection,
    weight_dtype: torch.dtype,
    vae_dtype: torch.dtype,
) -> SD3Parts:
    """The SD3Parts of Stability's single file ``path`` with the [flow] text-encoder files and
    [model] vae it needs; ModelError naming the file and the fix for any problem."""
    if not path.is_file():
        raise ModelError(f"model file {path} does not exist; nothing is downloaded")
    model_file = open_safetensors(path, MODEL_KEY, FAMILY)
    found = detect_sd3(model_file.keys())
    if found is None:
        raise ModelError(
            f"{path} holds no SD3 / SD3.5 MMDiT ({sample_keys(model_file.keys())}); point "
            f"{MODEL_KEY} at sd3_medium.safetensors, sd3.5_medium.safetensors, "
            "sd3.5_large.safetensors or a diffusers folder"
        )
    transformer = plan_transformer(model_file, found)
    refuse_channels(path, transformer.config["in_channels"])
    clip_l, clip_g, t5 = (plan_text_encoder(model_file, found, flow, key) for key in _ENCODERS)
    check_widths(path, transformer.config, *(named_config(plan) for plan in (clip_l, clip_g, t5)))
    vae, vae_folder = _plan_vae_source(model, model_file, found)
    t5_folder, t5_source = located_t5_tokenizer(
        find_sd3_t5_tokenizer_folder(flow.t5_tokenizer_path, model.tokenizer_cache_dir),
        flow.t5_tokenizer_path,
        model.tokenizer_cache_dir,
        missing_t5_tokenizer(flow.t5_tokenizer_path, path),
    )
    with offline():
        # Both CLIPs share CLIP's vocabulary; CLIP-G (OpenCLIP) looks in tokenizer_2/ first.
        tokenizers = [
            load_tokenizer_for(
                kind, index, path, model.tokenizer_path, model.tokenizer_cache_dir, plan.config,
                name,
            )  # fmt: skip
            for index, (kind, plan, name) in enumerate(
                (("clip", clip_l, "CLIP-L"), ("openclip", clip_g, "CLIP-G"))
            )
        ]
        t5_tokenizer = load_t5_tokenizer(t5_folder, t5.config, t5_source)
        modules = [load_plan(p, weight_dtype) for p in (transformer, clip_l, clip_g, t5)]
        if vae is not None:
            vae_module = load_plan(vae, vae_dtype)
        else:
            vae_module = load_vae(str(vae_folder), sd3_shapes.vae_config(), vae_dtype)
    transformer_module, clip_l_module, clip_g_module, t5_module = modules
    return SD3Parts(
        transformer_module, vae_module, clip_l_module, clip_g_module, t5_module,
        *tokenizers, t5_tokenizer, found.variant, path,
    )  # fmt: skip


def _wrong_file(
    what: str, file: CheckpointFile, expected: str, problem: str, key: str
) -> ModelError:
    return ModelError(
        f"{what} = {file.path} is not {expected}: {problem} (the file looks like "
        f"{looks_like(file.keys())}); set {key} in {_SECTION[key]} to {expected}'s file"
    )


# --- transformer --------------------------------------------------------------------------------


def plan_transformer(file: CheckpointFile, found: SD3Keys) -> Plan:
    """The MMDiT of ``file`` (the model file, in the layout ``found`` says)."""
    refuse_scaled_fp8(file, MODEL_KEY)
    original = found.layout == "original"
    if original:
        # A full checkpoint holds other parts beside model.diffusion_model.*.
        others = (VAE_PREFIX, "text_encoders.")
        keys = [k for k in file if k.startswith(found.prefix) and not k.startswith(others)]
    else:
        keys = list(file.keys())
    block_head = re.compile(re.escape(found.prefix) + r"joint_blocks\.\d+\.")

    def block(key: str) -> str:
        # Each block's fused tensors with its own keys: its pre-only context stream (no MLP)
        # shows only among them.
        found_block = block_head.match(key)
        return found_block.group(0) if found_block else ""

    def convert(state):
        return transformer_from_original(state) if original else dict(state)

    return plan_part(
        "transformer", MODEL_KEY, file, keys, convert, _build_transformer,
        lambda shapes: transformer_config_from_shapes(shapes, found),
        lambda exc: ModelError(
            f"{MODEL_KEY} = {file.path}: {one_line(exc)}; it is not an SD3 / SD3.5 MMDiT"
        ),
        group=block if original else None, label=f"{FAMILY} transformer",
    )  # fmt: skip


def _build_transformer(config: dict) -> torch.nn.Module:
    from diffusers import SD3Transformer2DModel

    # Buffers on the meta device too: the position table (0.9 GB in float32 for 3.5 Medium) is
    # computed at construction, and the file's own is loaded over it (its only buffer).
    with torch.device("meta"):
        return SD3Transformer2DModel.from_config(config)


# --- text encoders ------------------------------------------------------------------------------


def plan_text_encoder(
    model_file: CheckpointFile, found: SD3Keys, flow: FlowSection, key: str
) -> Plan:
    """The text encoder ``key`` ("clip_l", "clip_g", "t5xxl"): its [flow] file when set, else
    the one inside the model file; ModelError naming the key when neither is there."""
    if getattr(flow, key):
        return plan_flow_file(key, getattr(flow, key))
    if not getattr(found, key):
        raise ModelError(
            f"{model_file.path.name} does not hold {_ENCODERS[key][1]} "
            f"({TEXT_ENCODER_PREFIXES[key]}*): set {key} = \"<path to {key}.safetensors>\" in "
            "[flow] (or use a diffusers folder)"
        )
    return _plan_encoder(model_file, f"{MODEL_KEY} ({key} inside)", key)


def _plan_encoder(file: CheckpointFile, what: str, key: str) -> Plan:
    """The text encoder ``key`` from ``file`` (named ``what`` in messages): under its prefix in
    a full checkpoint (a file cut out of one keeps it), else from the file's own keys."""
    inside = TEXT_ENCODER_PREFIXES[key]
    prefix = inside if any(k.startswith(inside) for k in file) else ""
    refuse_scaled_fp8(file, what)
    if key == "t5xxl":
        return plan_t5(file, what, prefix)
    return plan_clip(file, what, prefix, key)


def plan_clip(file: CheckpointFile, what: str, prefix: str, key: str) -> Plan:
    """CLIP-L (``key`` "clip_l") or CLIP-G ("clip_g") with its projection, from the keys under
    ``prefix``."""
    part, expected, label, base = _ENCODERS[key]
    keys = [k for k in file if k.startswith(prefix) and not k.endswith(_CLIP_UNUSED)]
    if not any(k.endswith("embeddings.token_embedding.weight") for k in keys):
        raise _wrong_file(
            what, file, expected, f"it has no {prefix}*embeddings.token_embedding.weight", key
        )
    identity = key == "clip_l" and prefix + "text_projection.weight" not in keys
    if identity:
        log.info(
            "%s %s has no text_projection.weight: CLIP-L's projection is the identity, as in "
            "Stability's reference code and ComfyUI",
            what,
            file.path.name,
        )

    def convert(state):
        out = names.with_text_model_prefix({k[len(prefix) :]: v for k, v in state.items()})
        if identity:
            embed = out["text_model.embeddings.token_embedding.weight"]
            width = embed.shape[1]
            out["text_projection.weight"] = torch.eye(width, dtype=embed.dtype, device=embed.device)
        return out

    return plan_clip_encoder(
        file, what, keys, part, label, base(), convert, _build_clip,
        lambda problem: _wrong_file(what, file, expected, problem, key),
    )  # fmt: skip


def _build_clip(config: dict) -> torch.nn.Module:
    from transformers import CLIPTextConfig, CLIPTextModelWithProjection

    return CLIPTextModelWithProjection(CLIPTextConfig(**config))


def plan_t5(file: CheckpointFile, what: str, prefix: str) -> Plan:
    """The T5-XXL encoder from the keys under ``prefix``."""
    part, expected, label, base = _ENCODERS["t5xxl"]
    return plan_t5_encoder(
        file, what, prefix, part, label, base(),
        lambda problem: _wrong_file(what, file, expected, problem, "t5xxl"),
    )  # fmt: skip


def named_config(plan: Plan) -> tuple[str, dict]:
    """(how messages name the plan's file, its config), for check_widths."""
    return f"{plan.what} = {plan.file.path.name}", plan.config


def check_widths(
    path: Path, config: dict, clip_l: tuple[str, dict], clip_g: tuple[str, dict],
    t5: tuple[str, dict],
) -> None:  # fmt: skip
    """The encoders' outputs fit the transformer ``config`` (of ``path``): the two projected
    pooled outputs side by side, both CLIPs' states side by side within T5's width, T5's width.
    Each encoder is (how messages name it, its config)."""
    pooled = (clip_l[1]["projection_dim"], clip_g[1]["projection_dim"])
    widths = (clip_l[1]["hidden_size"], clip_g[1]["hidden_size"])
    context = config["joint_attention_dim"]
    if sum(pooled) != config["pooled_projection_dim"] or sum(widths) > context:
        raise ModelError(
            f"the CLIPs do not fit {path.name}: CLIP-L ({clip_l[0]}) is {widths[0]} wide with "
            f"{pooled[0]} pooled features, CLIP-G ({clip_g[0]}) {widths[1]} with {pooled[1]}, "
            f"the transformer takes {config['pooled_projection_dim']} pooled features and "
            f"{context}-wide text; set clip_l and clip_g in [flow] to SD3's CLIP-L and CLIP-G "
            "files"
        )
    if t5[1]["d_model"] != context:
        raise ModelError(
            f"{t5[0]} is {t5[1]['d_model']} wide, {path.name} takes {context}-wide T5 states; "
            "set t5xxl in [flow] to the T5-XXL file"
        )


def plan_flow_file(key: str, value: str) -> Plan:
    """The plan of the [flow] clip_l, clip_g or t5xxl file ``key`` names (``value``), checked
    before any weight is read: with a diffusers folder it replaces the folder's text encoder."""
    return _plan_encoder(component_file(key, value, _ENCODERS[key][1], FAMILY), key, key)


# --- VAE ----------------------------------------------------------------------------------------


def load_vae_option(model: ModelSection, vae_dtype: torch.dtype) -> torch.nn.Module:
    """The VAE [model] vae names (a file or a diffusers VAE folder), for a model whose own
    VAE it replaces (a diffusers folder)."""
    plan, folder = _plan_vae_source(model, None, None)
    with offline():
        if plan is not None:
            return load_plan(plan, vae_dtype)
        return load_vae(str(folder), sd3_shapes.vae_config(), vae_dtype)


def _plan_vae_source(
    model: ModelSection, model_file: CheckpointFile | None, found: SD3Keys | None
) -> tuple[Plan | None, Path | None]:
    """The VAE's plan, or a diffusers VAE folder (or .ckpt file) that library.models.vae_file
    reads: [model] vae when set, else the one inside the model file."""
    if model.vae:
        path = Path(model.vae).expanduser().absolute()
        if not path.exists():
            raise ModelError(f"vae = {path} does not exist; set vae in [model] to {_VAE}'s file")
        if path.is_dir() or path.suffix.lower() != ".safetensors":
            return None, path
        return plan_vae(open_safetensors(path, "vae", FAMILY), "vae", (VAE_PREFIX, "vae.")), None
    if found is not None and found.vae:
        return plan_vae(model_file, f"{MODEL_KEY} (its VAE)", (VAE_PREFIX,)), None
    raise ModelError(
        f'{model_file.path} holds no VAE ({VAE_PREFIX}*): set vae = "<path to the SD3 VAE '
        "file>\" in [model] (Stability's SD3 files hold one), or use a diffusers folder"
    )


def plan_vae(file: CheckpointFile, what: str, prefixes: tuple[str, ...]) -> Plan:
    """The 16-channel VAE from the keys under the first of ``prefixes`` the file has, with SD3's
    latent scale and shift whatever the file's config says (they belong to the MMDiT)."""
    base = sd3_shapes.vae_config()
    return plan_autoencoder(
        file, what, prefixes, ae_from_original, base, f"{FAMILY} VAE",
        (sd3_shapes.LATENT_CHANNELS, "SD3's"),
        lambda problem: _wrong_file(what, file, _VAE, problem, "vae"),
        fixed={k: base[k] for k in ("scaling_factor", "shift_factor")},
    )  # fmt: skip
