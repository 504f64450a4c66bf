"""Which models load as FLUX.1 Kontext [dev]: a schnell-shaped transformer (no guidance input)
is refused by Kontext's look at the checked parts, before any weight is read."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from library.config.flow_schema import FlowSection
from library.config.schema import ModelSection
from library.errors import ModelError
from library.models.families import folder_loader, spec_loader
from library.models.loader import load_components


def _no_weights(*args, **kwargs):
    raise AssertionError("a weight was read before the model was refused")


def test_a_schnell_shaped_kontext_folder_is_refused_before_any_weight(
    kit_folders, tmp_path, monkeypatch
):
    folder = tmp_path / "kontext-schnell"
    shutil.copytree(kit_folders("flux", "schnell"), folder)
    index_file = folder / "model_index.json"
    index = json.loads(index_file.read_text(encoding="utf-8"))
    index_file.write_text(json.dumps({**index, "_class_name": "FluxKontextPipeline"}), "utf-8")
    monkeypatch.setattr(folder_loader, "load_weights", _no_weights)
    monkeypatch.setattr(spec_loader, "load_weights", _no_weights)
    model = ModelSection(pretrained_model_name_or_path=str(folder))
    with pytest.raises(ModelError, match="no distilled guidance input.*flux1-kontext-dev"):
        load_components(model, torch.float32, FlowSection())
