"""Z-Image from the single files ComfyUI users have: the transformer file
(pretrained_model_name_or_path), the Qwen3-4B text encoder ([flow] text_encoder, musubi-tuner's
--text_encoder) and FLUX.1's AE ([model] vae, musubi-tuner's --vae), with the Qwen3 tokenizer from
tokenizer_path.

As Comfy-Org distributes them (Comfy-Org/z_image_turbo, Comfy-Org/z_image, ``split_files/``):

- ``diffusion_models/z_image_turbo_bf16.safetensors``: the transformer in the original names
  (keys.py), bf16, without a prefix; full checkpoints put it under ``model.diffusion_model.``,
  and a transformer saved by diffusers keeps diffusers' names: all three are read;
- ``text_encoders/qwen_3_4b.safetensors``: Qwen3-4B in transformers' names under ``model.``
  (``model.layers.0.self_attn.q_proj.weight``, ``model.embed_tokens.weight``,
  ``model.norm.weight``), bf16, without the LM head; files without the ``model.`` prefix, or
  with ``lm_head.weight`` (a whole Qwen3ForCausalLM), are read too, the head left out;
- ``vae/ae.safetensors``: FLUX.1's AE, read by FLUX.1's AE reader (flux/files.py).

Each file's config is the one in its header (``difftune.config.<part>``, which difftune's
full fine-tunes write) when it fits, else the released one with the sizes the shapes show
(file_configs.py). Every header is read and every tensor's name and shape checked against the
module it fills, before any weight is read; a missing or misshapen tensor is refused naming the
file and the key as the file spells it.

The variant (Turbo or Base: the sampling shift) is not in a transformer file: the header's
scheduler config when difftune wrote it, else the file name (``turbo`` in it: Turbo, else Base).
"""

from __future__ import annotations

import json
import logging
import re
from dataclasses import dataclass
from pathlib import Path

import torch

from library.config.flow_schema import FlowSection
from library.config.schema import ModelSection
from library.errors import ModelError
from library.models.checkpoint_file import CheckpointFile
from library.models.families.file_contents import looks_like, sample_keys
from library.models.families.file_plans import (
    Plan,
    family_component_file,
    load_plan,
    open_safetensors,
    refuse_scaled_fp8,
)
from library.models.families.flux.files import plan_ae as flux_plan_ae
from library.models.families.local_tokenizer import load_local_tokenizer
from library.models.families.zimage import file_configs, keys
from library.models.families.zimage.detect import detect_zimage
from library.models.families.zimage.shapes import (
    LATENT_CHANNELS,
    SCHEDULER_SHIFT,
    ae_config,
    scheduler_config,
)
from library.models.loader import offline
from library.models.plans import CONFIG_METADATA, empty_module, shapes_problem
from library.models.vae_file import load_vae

log = logging.getLogger(__name__)

FAMILY = "Z-Image"
# config key -> (its section, what it names) for messages
COMPONENT_FILES = {
    "text_encoder": ("[flow]", "the Qwen3-4B text encoder (qwen_3_4b.safetensors)"),
    "vae": ("[model]", "the autoencoder (ae.safetensors, FLUX.1's)"),
}
TEXT_PREFIX = "model."  # transformers' Qwen3ForCausalLM names the base model so
_UNUSED_TEXT_KEYS = ("lm_head.weight",)  # the LM head: Qwen3Model has none (tied to embed_tokens)
_BLOCK = re.compile(r"(model\.diffusion_model\.)?(layers|noise_refiner|context_refiner)\.\d+\.")


@dataclass
class ZImageFiles:
    """The modules and tokenizer read from the single files, and the sampling scheduler config
    of the variant the transformer file is."""

    transformer: torch.nn.Module
    vae: torch.nn.Module
    text_encoder: torch.nn.Module
    tokenizer: object
    scheduler: dict
    model_dir: Path  # the diffusers folder, or the transformer file


def load_zimage_files(
    path: Path, model: ModelSection, flow: FlowSection, weight_dtype: torch.dtype,
    vae_dtype: torch.dtype,
) -> ZImageFiles:  # fmt: skip
    """The transformer file ``path`` with [flow] text_encoder, [model] vae and the tokenizer_path
    tokenizer; ModelError for any problem, found before any weight is read."""
    if not path.is_file():
        raise ModelError(f"model file {path} does not exist; nothing is downloaded")
    transformer_file = open_safetensors(path, "pretrained_model_name_or_path", FAMILY)
    plans = {
        "transformer": plan_transformer(transformer_file),
        "text_encoder": plan_text_encoder(component_file(flow.text_encoder, "text_encoder")),
    }
    vae_folder = Path(model.vae).expanduser().absolute() if model.vae else None
    if vae_folder is None or not vae_folder.is_dir():
        plans["ae"], vae_folder = plan_ae(component_file(model.vae, "vae")), None
    check_caption_width(plans["transformer"], plans["text_encoder"])
    tokenizer = load_qwen3_tokenizer(model.tokenizer_path, plans["text_encoder"].config, path)
    with offline():
        transformer, text_encoder = (
            load_plan(plans[p], weight_dtype) for p in ("transformer", "text_encoder")
        )
        if vae_folder is None:
            vae = load_plan(plans["ae"], vae_dtype)
        else:
            vae = load_vae_option(vae_folder, vae_dtype)
    scheduler = file_scheduler(transformer_file)
    return ZImageFiles(transformer, vae, text_encoder, tokenizer, scheduler, path)


def component_file(value: str | None, key: str) -> CheckpointFile:
    """The component file the config key ``key`` names (``value``), its header read; ModelError
    naming the key when unusable."""
    section, what = COMPONENT_FILES[key]
    return family_component_file(value, key, section, what, FAMILY)


def load_vae_option(path: Path, dtype: torch.dtype) -> torch.nn.Module:
    """[model] vae as a diffusers VAE folder or a .ckpt (library.models.vae_file), which must
    make FLUX.1's 16-channel latents."""

    vae = load_vae(str(path), ae_config(), dtype)
    channels = vae.config.latent_channels
    if channels != LATENT_CHANNELS:
        raise ModelError(
            f"vae = {path} makes {channels}-channel latents and Z-Image takes "
            f"{LATENT_CHANNELS} (FLUX.1's AE); set vae to Z-Image's ae.safetensors"
        )
    return vae


def plan_ae(file: CheckpointFile) -> Plan:
    """FLUX.1's AE reader: Z-Image ships FLUX.1's AE (same keys, 16 latent channels). Its
    messages name the file as ``vae``, the key it is given by."""
    import dataclasses

    try:
        plan = flux_plan_ae(file)
    except ModelError as exc:
        raise ModelError(_as_vae(str(exc))) from None
    return dataclasses.replace(plan, what="vae", label="Z-Image vae")


def _as_vae(message: str) -> str:
    """FLUX.1's AE messages, which name its [flow] ae key, with Z-Image's [model] vae."""
    return message.replace("ae = ", "vae = ", 1).replace("set ae in [flow]", "set vae in [model]")


def file_scheduler(file: CheckpointFile) -> dict:
    """The sampling scheduler config of the transformer file's variant (module docstring)."""
    stored = file.metadata.get(CONFIG_METADATA + "scheduler")
    if stored:
        try:
            return dict(json.loads(stored))
        except (ValueError, TypeError):
            pass  # a damaged header entry: the name decides
    variant = "turbo" if "turbo" in file.path.name.lower() else "base"
    log.info(
        "%s: sampled as Z-Image %s (shift %g), by its file name",
        file.path.name,
        variant.capitalize(),
        SCHEDULER_SHIFT[variant],
    )
    return scheduler_config(variant)


def _chosen_config(
    file: CheckpointFile, part: str, prefix: str, in_file, got: dict, derive, what: str,
    label: str,
) -> dict:  # fmt: skip
    """The config whose module holds exactly the file's tensors (``got``: name -> shape in the
    file's names; ``in_file(config)`` the module's): the header's, else ``derive()``'s from the
    shapes. When neither fits, ModelError naming the file and the first tensor (as the file
    names it) that does not fit the header's config (it says what the file should hold), else
    the derived one."""
    stored = _stored_config(file, part)
    if stored is not None and _shapes_of(in_file, stored) == got:
        return stored
    try:
        config = derive()
    except KeyError as exc:
        config, missing = None, f"it lacks {prefix}{exc.args[0]}, which the {label} has"
    except (IndexError, ValueError, ZeroDivisionError):
        config, missing = None, f"its tensors' sizes fit no {label}"
    target = stored if stored is not None and _shapes_of(in_file, stored) else config
    if target is None:
        raise ModelError(f"{what} = {file.path}: {missing}; re-download or re-convert it")
    expected = _shapes_of(in_file, target)
    if expected is None:
        raise ModelError(f"{what} = {file.path}: no {label} fits its tensors' sizes")
    problem = shapes_problem(expected, got, label)
    if problem:
        raise ModelError(f"{what} = {file.path}: {problem}; re-download or re-convert it")
    return target


def _shapes_of(in_file, config: dict) -> dict | None:
    """The module's tensor shapes in the file's names; None when the config builds none."""
    try:
        return in_file(config)
    except (ValueError, TypeError, KeyError, RuntimeError):
        return None


def _stored_config(file: CheckpointFile, part: str) -> dict | None:
    stored = file.metadata.get(CONFIG_METADATA + part)
    try:
        return dict(json.loads(stored)) if stored else None
    except (ValueError, TypeError):
        return None  # a stale or foreign entry: the shapes decide


# --- transformer ------------------------------------------------------------------------------


def plan_transformer(file: CheckpointFile) -> Plan:
    """The transformer's plan: original names (with or without ``model.diffusion_model.``) or
    diffusers' names, checked tensor by tensor against the config."""

    what, label = "pretrained_model_name_or_path", "Z-Image transformer"
    refuse_scaled_fp8(file, what)
    if detect_zimage(file.keys()) is None:
        raise ModelError(
            f"{file.path} holds no Z-Image transformer ({sample_keys(file.keys())}); point "
            "pretrained_model_name_or_path at z_image_turbo_bf16.safetensors or a diffusers folder"
        )
    prefixed = any(k.startswith(keys.CHECKPOINT_PREFIX) for k in file)
    prefix = keys.CHECKPOINT_PREFIX if prefixed else ""
    # A full checkpoint may hold other parts beside model.diffusion_model.*.
    file_keys = [k for k in file if k.startswith(prefix)]
    shapes = {k[len(prefix) :]: file.shape(k) for k in file_keys}
    diffusers_layout = any(k.startswith("all_x_embedder.") for k in shapes)

    def convert(state):
        return dict(state) if diffusers_layout else keys.original_to_diffusers(state)

    def in_file(config: dict) -> dict:
        """The module's tensor shapes as the file names them."""
        state = empty_module(_build_transformer, config).state_dict()
        named = state if diffusers_layout else keys.diffusers_to_original(state)
        return {prefix + k: tuple(v.shape) for k, v in named.items()}

    got = {prefix + k: tuple(v) for k, v in shapes.items() if k not in keys.DROPPED}

    def derive() -> dict:
        return file_configs.transformer_config(
            _original_shapes(shapes) if diffusers_layout else shapes
        )

    config = _chosen_config(file, "transformer", prefix, in_file, got, derive, what, label)
    used = [k for k in file_keys if k[len(prefix) :] not in keys.DROPPED]

    def block(key: str) -> str:
        # a block's fused qkv is split with its block: only one block's pieces are held twice
        found = _BLOCK.match(key)
        return found.group(0) if found else ""

    def strip(state):
        return convert({k[len(prefix) :]: v for k, v in state.items()})

    return Plan("transformer", what, file, used, config, strip, _build_transformer, group=block,
                label=label)  # fmt: skip


def _original_shapes(diffusers: dict) -> dict:
    """Diffusers-named shapes in the original names (the fused qkv stacks q, k and v)."""
    out: dict[str, tuple[int, ...]] = {}
    for key, shape in diffusers.items():
        name = keys.original_name(key)
        if name in out and name.endswith(keys.FUSED_QKV):
            out[name] = (out[name][0] + shape[0], *shape[1:])
        else:
            out[name] = tuple(shape)
    return out


def _build_transformer(config: dict) -> torch.nn.Module:
    from diffusers import ZImageTransformer2DModel

    return ZImageTransformer2DModel.from_config(config)


# --- Qwen3 --------------------------------------------------------------------------------------


def plan_text_encoder(file: CheckpointFile) -> Plan:
    """Qwen3-4B's plan: transformers' names with or without ``model.``, the LM head left out."""
    what, label = "text_encoder", "Qwen3 text encoder"
    refuse_scaled_fp8(file, what)
    prefix = TEXT_PREFIX if any(k.startswith(TEXT_PREFIX + "layers.") for k in file) else ""
    if f"{prefix}layers.0.self_attn.q_norm.weight" not in file:
        raise ModelError(
            f"{what} = {file.path} is not {COMPONENT_FILES[what][1]}: it has no "
            f"{prefix}layers.0.self_attn.q_norm.weight (the file looks like "
            f"{_looks_like(file)}); set {what} in [flow] to qwen_3_4b.safetensors"
        )
    file_keys = [k for k in file if k.startswith(prefix) and k not in _UNUSED_TEXT_KEYS]
    plain = {k[len(prefix) :]: file.shape(k) for k in file_keys}
    got = {prefix + k: tuple(v) for k, v in plain.items()}

    def in_file(config: dict) -> dict:
        state = empty_module(_build_qwen3, config).state_dict()
        return {prefix + k: tuple(v.shape) for k, v in state.items()}

    def derive() -> dict:
        return file_configs.text_encoder_config(plain)

    config = _chosen_config(file, "text_encoder", prefix, in_file, got, derive, what, label)

    def strip(state):
        return {k[len(prefix) :]: v for k, v in state.items()}

    return Plan("text_encoder", what, file, file_keys, config, strip, _build_qwen3, label=label)


def _looks_like(file: CheckpointFile) -> str:
    keys_ = file.keys()
    if any(k.startswith(("model.language_model.", "visual.", "model.visual.")) for k in keys_):
        return "a Qwen vision-language model, not Qwen3-4B"
    return looks_like(keys_)


def _build_qwen3(config: dict) -> torch.nn.Module:
    from transformers import Qwen3Config, Qwen3Model

    return Qwen3Model(Qwen3Config(**config))


def check_caption_width(transformer: Plan, text_encoder: Plan) -> None:
    """Qwen3's states are as wide as the transformer's caption input."""
    width = text_encoder.config["hidden_size"]
    takes = transformer.config["cap_feat_dim"]
    if width != takes:
        raise ModelError(
            f"text_encoder = {text_encoder.file.path} is {width} wide and the transformer of "
            f"{transformer.file.path} takes {takes}-wide caption states; set text_encoder in "
            "[flow] to Z-Image's Qwen3-4B file (qwen_3_4b.safetensors)"
        )


# --- tokenizer ----------------------------------------------------------------------------------


def load_qwen3_tokenizer(tokenizer_path: str | None, config: dict | None, model_file: Path):
    """The Qwen3 tokenizer in ``tokenizer_path`` (or its tokenizer/ subfolder, so a Z-Image
    diffusers folder works as it is); ModelError when unset, missing or not fitting the
    encoder's vocabulary (``config``, when known)."""
    return load_local_tokenizer(
        tokenizer_path, None if config is None else config["vocab_size"], model_file, "Qwen3",
        "a Z-Image diffusers folder's tokenizer/, or Qwen/Qwen3-4B's",
    )  # fmt: skip
