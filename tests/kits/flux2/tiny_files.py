"""A tiny FLUX.2 [klein] as the single files users have (files.py), for offline tests.

Written from ``build_tiny_flux2_components`` under a seed, so they hold the weights of
``write_tiny_flux2_folder`` with the same seed: the transformer in Black Forest Labs' names
(named as their files are), Qwen3 in transformers' names under ``model.`` without the LM head
(as Comfy-Org's qwen_3_4b.safetensors), the VAE as a diffusers folder, and the tokenizer.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from library.models.checkpoint_parts import CONFIG_METADATA
from library.models.families.flux2.names import TABLE
from tests.kits.flux2.tiny import (
    TOKENIZER,
    build_tiny_flux2_components,
    text_encoder_config,
    transformer_config,
)

TRANSFORMER_FILES = {"klein-base": "flux-2-klein-base-4b.safetensors",
                     "klein": "flux-2-klein-4b.safetensors"}  # fmt: skip


def write_tiny_flux2_files(folder: str | Path, variant: str = "klein-base", seed: int = 0) -> dict:
    """The tiny ``variant`` as files in ``folder``: paths by role ("transformer",
    "text_encoder", "vae" and "tokenizer" folders)."""
    from safetensors.torch import save_file

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    parts = build_tiny_flux2_components(seed)
    transformer = TABLE.to_original(parts["transformer"].state_dict())
    header = {"format": "pt", CONFIG_METADATA + "transformer": json.dumps(transformer_config())}
    paths = {"transformer": folder / TRANSFORMER_FILES[variant]}
    save_file({k: v.contiguous().clone() for k, v in transformer.items()},
              str(paths["transformer"]), metadata=header)  # fmt: skip
    text = {
        k: v.clone() for k, v in parts["text_encoder"].state_dict().items() if k != "lm_head.weight"
    }
    paths["text_encoder"] = folder / "qwen_3_4b.safetensors"
    header = {"format": "pt", CONFIG_METADATA + "text_encoder": json.dumps(text_encoder_config())}
    save_file(text, str(paths["text_encoder"]), metadata=header)
    parts["vae"].save_pretrained(folder / "vae")
    paths["vae"] = folder / "vae"
    paths["tokenizer"] = Path(shutil.copytree(TOKENIZER, folder / "tokenizer", dirs_exist_ok=True))
    return paths


def single_files(path, variant, seed) -> tuple[dict, dict]:
    """The ModelSection and FlowSection keys that load the tiny files (ConformanceKit)."""
    if variant == "dev":
        import pytest

        pytest.skip("FLUX.2 [dev]'s Mistral 3 file is not read yet (its folder is)")
    files = write_tiny_flux2_files(path, variant, seed)
    model = {"pretrained_model_name_or_path": str(files["transformer"]),
             "tokenizer_path": str(files["tokenizer"]), "vae": str(files["vae"])}  # fmt: skip
    return model, {"text_encoder": str(files["text_encoder"])}
