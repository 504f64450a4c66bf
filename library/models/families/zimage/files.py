"""Z-Image's own readers beside its spec (spec.py): the Qwen3-4B text encoder file, the Qwen3
tokenizer, a VAE folder or .ckpt, and the variant of a transformer file.

- ``text_encoders/qwen_3_4b.safetensors`` (Comfy-Org): Qwen3-4B in transformers' names under
  ``model.`` (``model.layers.0.self_attn.q_proj.weight``, ``model.embed_tokens.weight``,
  ``model.norm.weight``), bf16, without the LM head; files without the ``model.`` prefix, or with
  ``lm_head.weight`` (a whole Qwen3ForCausalLM), are read too, the head left out, by the shared
  Qwen3 reader (families/file_plans.py). Its config is the header's
  (``difftune.config.text_encoder``) when it fits, else the released one with the sizes the
  shapes show, checked tensor by tensor before any weight is read.
- The variant (Turbo or Base: the sampling shift) is not in a transformer file: the header's
  scheduler config when difftune wrote it, else the file name (``turbo`` in it: Turbo, else Base).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import torch

from library.errors import ModelError
from library.models.checkpoint_file import CheckpointFile
from library.models.families.file_plans import Plan, plan_qwen3_file
from library.models.families.local_tokenizer import load_local_tokenizer
from library.models.families.zimage.shapes import (
    LATENT_CHANNELS,
    SCHEDULER_SHIFT,
    ae_config,
    scheduler_config,
    text_encoder_config,
)
from library.models.plans import CONFIG_METADATA
from library.models.vae_file import load_vae

log = logging.getLogger(__name__)

# config key -> (its section, what it names) for messages
COMPONENT_FILES = {
    "text_encoder": ("[flow]", "the Qwen3-4B text encoder (qwen_3_4b.safetensors)"),
    "vae": ("[model]", "the autoencoder (ae.safetensors, FLUX.1's)"),
}


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


# --- Qwen3 --------------------------------------------------------------------------------------


def plan_text_encoder(file: CheckpointFile) -> Plan:
    """Qwen3-4B's plan (the shared Qwen3 reader): transformers' names with or without
    ``model.``, the LM head left out."""
    expected = COMPONENT_FILES["text_encoder"][1]
    return plan_qwen3_file(
        file, "text_encoder", expected, "qwen_3_4b.safetensors", text_encoder_config()
    )


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


def folder_tokenizer(folder):
    """A folder's Qwen3 tokenizer, or tokenizer_path's."""
    from transformers import AutoTokenizer

    if folder.model.tokenizer_path:
        plan = folder.plans.get("text_encoder")
        config = plan.config if plan is not None else None
        return load_qwen3_tokenizer(folder.model.tokenizer_path, config, folder.model_dir)
    tokenizer_dir = folder.model_dir / "tokenizer"
    try:
        return AutoTokenizer.from_pretrained(str(tokenizer_dir), local_files_only=True)
    except (OSError, ValueError) as exc:
        raise ModelError(f"cannot read the Qwen3 tokenizer in {tokenizer_dir}: {exc}") from None
