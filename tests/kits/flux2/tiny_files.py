"""A tiny FLUX.2 as the single files users have, for offline tests.

Written from ``build_tiny_flux2_components`` under a seed, so they hold the weights of
``write_tiny_flux2_folder`` with the same seed: the transformer in Black Forest Labs' names
(named as their files are: klein's, or dev's with its guidance embedder), klein's Qwen3 in
transformers' names under ``model.`` without the LM head (as Comfy-Org's qwen_3_4b.safetensors),
dev's Mistral 3 as Comfy-Org's mistral_3_small_flux2_bf16.safetensors (``comfy_mistral3``), the
VAE as a diffusers folder, and the tokenizer.
"""

from __future__ import annotations

import json
from pathlib import Path

from library.models.checkpoint_parts import CONFIG_METADATA
from library.models.families.flux2.names import TABLE
from tests.kits.flux2.tiny import (
    build_tiny_flux2_components,
    text_encoder_config,
    transformer_config,
    write_tokenizer,
)

TRANSFORMER_FILES = {"klein-base": "flux-2-klein-base-4b.safetensors",
                     "klein": "flux-2-klein-4b.safetensors", "dev": "flux2-dev.safetensors"}  # fmt: skip
TEXT_FILES = {"klein-base": "qwen_3_4b.safetensors", "klein": "qwen_3_4b.safetensors",
              "dev": "mistral_3_small_flux2_bf16.safetensors"}  # fmt: skip


def comfy_mistral3(encoder) -> dict:
    """A Mistral3ForConditionalGeneration's tensors as Comfy-Org's Mistral 3 file holds them:
    the language model under ``model.`` (Llama-style names), the vision tower and projector at
    the top, the tokenizer's bytes as ``tekken_model``; no LM head."""
    import torch

    state = {}
    for key, value in encoder.state_dict().items():
        for old, new in (("model.language_model.", "model."), ("model.", "")):
            if key.startswith(old):
                state[new + key[len(old) :]] = value.clone().contiguous()
                break
    return {**state, "tekken_model": torch.tensor(list(b'{"vocab": []}'), dtype=torch.uint8)}


def write_tiny_flux2_files(folder: str | Path, variant: str = "klein-base", seed: int = 0) -> dict:
    """The tiny ``variant`` as files in ``folder``: paths by role ("transformer",
    "text_encoder", "vae" and "tokenizer" folders)."""
    from safetensors.torch import save_file

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    dev = variant == "dev"
    parts = build_tiny_flux2_components(seed, dev)
    transformer = TABLE.to_original(parts["transformer"].state_dict())
    header = {"format": "pt", CONFIG_METADATA + "transformer": json.dumps(transformer_config(dev))}
    paths = {"transformer": folder / TRANSFORMER_FILES[variant]}
    save_file({k: v.contiguous().clone() for k, v in transformer.items()},
              str(paths["transformer"]), metadata=header)  # fmt: skip
    encoder = parts["text_encoder"]
    if dev:
        text, config = comfy_mistral3(encoder), encoder.config.text_config.to_dict()
    else:
        text = {k: v.clone() for k, v in encoder.state_dict().items() if k != "lm_head.weight"}
        config = text_encoder_config()
    paths["text_encoder"] = folder / TEXT_FILES[variant]
    header = {"format": "pt", CONFIG_METADATA + "text_encoder": json.dumps(config)}
    save_file(text, str(paths["text_encoder"]), metadata=header)
    parts["vae"].save_pretrained(folder / "vae")
    paths["vae"] = folder / "vae"
    paths["tokenizer"] = write_tokenizer(folder / "tokenizer", dev)
    return paths


def single_files(path, variant, seed) -> tuple[dict, dict]:
    """The ModelSection and FlowSection keys that load the tiny files (ConformanceKit)."""
    files = write_tiny_flux2_files(path, variant, seed)
    model = {"pretrained_model_name_or_path": str(files["transformer"]),
             "tokenizer_path": str(files["tokenizer"]), "vae": str(files["vae"])}  # fmt: skip
    return model, {"text_encoder": str(files["text_encoder"])}
