"""The ``vae`` option: a VAE from its own file or folder, replacing the model's.

Accepted: a diffusers VAE folder (config.json + weights), a diffusers model folder (its vae/), or
a weights file whose keys are in the original layout (``first_stage_model.encoder.down.0...``,
with or without that prefix, e.g. vae-ft-mse-840000-ema-pruned) or in diffusers' layout
(``encoder.down_blocks.0...``). A file has no config: the model's own VAE config is used when
every tensor fits it (a VAE fine-tune), else one derived from the shapes. The scaling factor stays
the model's. Inside loader.shapes_only() (the dry run) only the file's header or the folder's
config is read, so a VAE of another latent width is refused there too (library.models.loader).
"""

from __future__ import annotations

from pathlib import Path

import torch

from library.errors import ModelError
from library.models import original_names as names
from library.models import shape_configs
from library.models.checkpoint_file import CheckpointFile
from library.models.checkpoint_parts import build_vae, convert_vae, plan_part
from library.models.model_files import load_weights, offline
from library.models.plans import load_plan


def load_vae(source: str, model_config, dtype: torch.dtype) -> torch.nn.Module:
    """The VAE at ``source`` (file or folder), frozen, in ``dtype``; ModelError if unusable."""
    path = Path(source).expanduser().absolute()
    base = {k: v for k, v in dict(model_config).items() if not k.startswith("_")}
    with offline():
        if path.is_dir():
            if (path / "vae" / "config.json").is_file():
                vae = load_weights(_autoencoder(), path, "vae", dtype)
            elif (path / "config.json").is_file():
                stem = "diffusion_pytorch_model"
                vae = load_weights(_autoencoder(), path.parent, path.name, dtype, stem)
            else:
                raise ModelError(f"vae folder {path} has no config.json (nor a vae/ subfolder)")
            vae.requires_grad_(False)
            vae.eval()
            return vae
        if not path.is_file():
            raise ModelError(f"vae {path} does not exist; set vae to a VAE file or folder")
        file = CheckpointFile(path)
        return load_plan(_plan(file, base), dtype)


def _autoencoder():
    from diffusers import AutoencoderKL

    return AutoencoderKL


def _plan(file: CheckpointFile, base: dict):
    keys = file.keys()
    prefix = next((p for p in (names.VAE_PREFIX, "vae.") if any(k.startswith(p) for k in keys)), "")
    stripped = [k[len(prefix) :] for k in keys if k.startswith(prefix)]
    if any(k.startswith("encoder.down.") for k in stripped):
        convert = convert_vae

        def derive(shapes: dict) -> dict:
            return shape_configs.vae_config_from_shapes(shapes, base)

    elif any(k.startswith("encoder.down_blocks.") for k in stripped):
        levels = len({k.split(".")[2] for k in stripped if k.startswith("encoder.down_blocks.")})

        def convert(state: dict, config: dict) -> tuple[dict, list[str]]:
            return dict(state), []

        def derive(shapes: dict) -> dict:
            original = {names.vae_key_to_original(k, levels): v for k, v in shapes.items()}
            return shape_configs.vae_config_from_shapes(original, base)

    else:
        sample = ", ".join(sorted(keys)[:3]) or "no tensors"
        raise ModelError(
            f"vae {file.path} holds no VAE weights (keys like encoder.down.0.* or "
            f"encoder.down_blocks.0.*; found {sample})"
        )
    return plan_part(file, "vae", prefix, base, convert, build_vae, derive)
