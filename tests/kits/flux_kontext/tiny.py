"""A tiny FLUX.1 Kontext [dev] for tests: FLUX.1's tiny dev parts as a FluxKontextPipeline
folder (model_index.json as the released model's: FLUX.1's parts and no image encoder)."""

from __future__ import annotations

import json
from pathlib import Path

from library.models.families.kontext.sampling import PIPELINE
from tests.kits.flux.tiny_files import write_tiny_flux_folder


def write_tiny_kontext_folder(path: str | Path, seed: int = 0) -> Path:
    """Write a tiny FLUX.1 Kontext [dev] diffusers folder to ``path``; returns ``path``."""
    path = write_tiny_flux_folder(path, "dev", seed)
    index_file = path / "model_index.json"
    index = json.loads(index_file.read_text(encoding="utf-8"))
    # the released folder names the pipeline's optional IP-Adapter parts as absent
    index |= {"_class_name": PIPELINE, "feature_extractor": [None, None],
              "image_encoder": [None, None]}  # fmt: skip
    index_file.write_text(json.dumps(index, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    return path
