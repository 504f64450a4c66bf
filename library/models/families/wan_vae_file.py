"""The Qwen-Image VAE's single file (ComfyUI's qwen_image_vae.safetensors, in Wan 2.1's names;
library/models/wan_vae_keys.py), or a diffusers folder's vae/ file, planned for loading: every
family that uses this VAE reads its file here. Its config is the one in the file's header
(``difftune.config.vae``) when there is one, else the released one the family gives; a family
on the released video VAE declares it with ``video_vae_part``."""

from __future__ import annotations

import functools
import json
from collections.abc import Callable

import torch

from library.errors import ModelError
from library.models import wan_vae_keys
from library.models.checkpoint_file import CheckpointFile
from library.models.checkpoint_parts import CONFIG_METADATA
from library.models.families.file_contents import looks_like
from library.models.families.file_plans import Plan, plan_with_config
from library.models.families.spec import ComponentFile, SpecPart
from library.models.released_configs import video_vae16_config


def stored_config(file: CheckpointFile, part: str) -> dict | None:
    """The ``part`` config in the file's header (difftune.config.<part>); None when there is
    none that reads as a JSON object."""
    try:
        stored = json.loads(file.metadata.get(CONFIG_METADATA + part) or "null")
    except ValueError:
        return None
    return stored if isinstance(stored, dict) else None


def plan_vae(
    file: CheckpointFile, what: str, description: str, released: Callable[[], dict], label: str,
    model_class: str = "AutoencoderKLQwenImage",
) -> Plan:  # fmt: skip
    """The VAE in Wan 2.1's names or diffusers'; ModelError naming ``what`` (the config key)
    and ``description`` (the file it should be) for a file that is neither. ``model_class``:
    the diffusers class built (the same network under two names, with the same keys)."""
    keys = list(file.keys())
    if wan_vae_keys.ORIGINAL_MARK in file:
        original = True
    elif wan_vae_keys.DIFFUSERS_MARK in file and any(".down_blocks." in k for k in keys):
        original = False
    else:
        raise ModelError(
            f"{what} = {file.path} is not {description} (the file looks like "
            f"{looks_like(keys)}); set {what} in [model] to {description}"
        )

    def plan_of(config: dict) -> Plan:
        def convert(state):
            return wan_vae_keys.vae_from_original(state, config) if original else dict(state)

        build = functools.partial(_build_vae, model_class)
        return Plan("vae", what, file, keys, config, convert, build, label=label)

    # the header's config when it fits, else the released one; the header's stays the measure
    # when it does not fit, so the error names the tensor that differs from it
    return plan_with_config("vae", plan_of, file, lambda: stored_config(file, "vae") or released())


def video_vae_part(description: str, label: str) -> SpecPart:
    """A spec's VAE when it is the released 16-channel video VAE (AutoencoderKLQwenImage): a
    folder's vae/, or the [model] vae file in Wan 2.1's names or diffusers' (``description``:
    the file it must be, ``label``: the VAE's name, for messages)."""

    def plan(file: CheckpointFile) -> Plan:
        return plan_vae(file, "vae", description, video_vae16_config, label)

    return SpecPart(
        "vae", "vae", "diffusers:AutoencoderKLQwenImage",
        file=ComponentFile("vae", "[model]", description, plan),
    )  # fmt: skip


def _build_vae(model_class: str, config: dict) -> torch.nn.Module:
    import diffusers

    return getattr(diffusers, model_class)(**config)
