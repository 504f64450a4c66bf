"""A tiny Chroma as the single files users have: the transformer in the original names
(Chroma1-HD.safetensors' layout), FLUX.1's t5xxl and ae files, and T5's tokenizer folder; written
from ``build_tiny_chroma_components`` under the same seed as tiny.write_tiny_chroma_folder."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from library.models.checkpoint_parts import CONFIG_METADATA
from library.models.families.chroma.original_keys import transformer_to_original
from library.models.families.flux.original_keys import ae_to_original
from tests.kits.chroma.tiny import build_tiny_chroma_components
from tests.kits.chroma.tiny_shapes import tiny_transformer_config
from tests.kits.flux.tiny import write_tiny_t5_tokenizer
from tests.kits.flux.tiny_shapes import tiny_ae_config, tiny_t5_config


def write_tiny_chroma_files(
    folder: str | Path, seed: int = 0, dtype: torch.dtype = torch.float32,
    config_metadata: bool = True,
) -> dict[str, Path]:  # fmt: skip
    """Write the files in ``folder``; returns their paths by role ("transformer", "t5xxl",
    "ae", "t5_tokenizer"). ``config_metadata``: the transformer's exact config in its header
    (difftune.config.transformer); without it the loader reads the sizes off the shapes. The
    t5xxl and ae files carry theirs as FLUX.1's tiny files do (the AE's sample size shows in no
    shape)."""
    from safetensors.torch import save_file

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    parts = build_tiny_chroma_components(seed)
    t5 = dict(parts["text_encoder"].state_dict())
    del t5["encoder.embed_tokens.weight"]  # the same tensor as shared.weight (tied)
    states = {
        "transformer": transformer_to_original(parts["transformer"].state_dict()),
        "t5xxl": t5,
        "ae": ae_to_original(parts["vae"].state_dict()),
    }
    names = {"transformer": "chroma.safetensors", "t5xxl": "t5xxl.safetensors",
             "ae": "ae.safetensors"}  # fmt: skip
    # the part names FLUX.1's t5xxl and ae readers look up in the header
    configs = {"t5xxl": ("text_encoder_2", tiny_t5_config()), "ae": ("vae", tiny_ae_config())}
    if config_metadata:
        configs["transformer"] = ("transformer", tiny_transformer_config())
    paths = {}
    for role, state in states.items():
        meta = {"format": "pt"}
        if role in configs:
            part, config = configs[role]
            meta[CONFIG_METADATA + part] = json.dumps(config)
        tensors = {k: v.detach().to(dtype).contiguous().clone() for k, v in state.items()}
        paths[role] = folder / names[role]
        save_file(tensors, str(paths[role]), metadata=meta)
    paths["t5_tokenizer"] = write_tiny_t5_tokenizer(folder / "t5_tokenizer")
    return paths
