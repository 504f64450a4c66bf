"""musubi-tuner's FLUX.2 model_version (dev, klein-4b, klein-base-4b, klein-9b, klein-base-9b) is
read: it says whether a transformer file whose name and header do not tell is distilled, and a
value that names another model than the files (sizes, base or distilled) is refused naming the
file and the value before any weight is read. Qwen-Image keeps its own values."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from safetensors.torch import load_file, save_file

from library.config.flow_schema import FlowSection
from library.config.schema import ModelSection
from library.errors import ConfigError, ModelError
from library.models.families import spec_loader
from library.models.families.flux2.family import flux2_family
from library.models.families.flux2.spec import RELEASED, inspect
from library.models.families.qwenimage.family import qwenimage_family
from library.models.loader import load_components
from tests.kits.flux2.tiny_files import write_tiny_flux2_files


def _renamed(path: Path, name: str) -> Path:
    out = path.with_name(name)
    save_file(load_file(str(path)), str(out), metadata={"format": "pt"})
    return out


def _load(files: dict, transformer: Path, version: str):
    model = ModelSection(pretrained_model_name_or_path=str(transformer),
                         tokenizer_path=str(files["tokenizer"]), vae=str(files["vae"]))  # fmt: skip
    flow = FlowSection(text_encoder=str(files["text_encoder"]), model_version=version)
    return load_components(model, torch.float32, flow)


@pytest.mark.parametrize(("version", "distilled"), [("klein-4b", True), ("klein-base-4b", False)])
def test_model_version_says_what_a_files_name_does_not(tmp_path, version, distilled):
    files = write_tiny_flux2_files(tmp_path / "f")
    parts = _load(files, _renamed(files["transformer"], "my_finetune.safetensors"), version)
    assert parts.family.distilled is distilled


@pytest.mark.parametrize(
    ("variant", "version", "fit"),
    [("klein-base", "klein-4b", "klein-base-4b"), ("klein", "klein-base-4b", "klein-4b"),
     ("klein-base", "dev", "klein-base-4b"), ("dev", "klein-base-4b", "dev")],
)  # fmt: skip
def test_a_model_version_of_another_model_is_refused_before_any_weight_is_read(
    tmp_path, monkeypatch, variant, version, fit
):
    files = write_tiny_flux2_files(tmp_path / "f", variant)
    monkeypatch.setattr(spec_loader, "_load", lambda *a: pytest.fail("weights were read"))
    with pytest.raises(ModelError) as refused:
        _load(files, files["transformer"], version)
    message = str(refused.value)
    assert "\n" not in message and files["transformer"].name in message
    assert f'model_version = "{version}"' in message and f'set model_version = "{fit}"' in message


def _checked(released: str, name: str, version: str):
    """What inspect sees of a released transformer file (sizes from its config, no header)."""
    config = {**RELEASED[released], "guidance_embeds": released == "dev"}
    width = config["joint_attention_dim"] // 3
    file = SimpleNamespace(metadata={}, path=Path(name))
    return SimpleNamespace(
        config=config, model_dir=Path(name), flow=FlowSection(model_version=version),
        plans={"transformer": SimpleNamespace(file=file)},
        part_config=lambda sub: config if sub == "transformer" else {"hidden_size": width},
        part_source=lambda sub: name,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("released", "name", "version", "fit"),
    [("klein-9b", "flux-2-klein-base-9b.safetensors", "klein-base-4b", "klein-base-9b"),
     ("klein-4b", "model.safetensors", "klein-9b", "klein-4b"),
     ("dev", "model.safetensors", "klein-4b", "dev")],
)  # fmt: skip
def test_the_released_sizes_are_checked(released, name, version, fit):
    with pytest.raises(ModelError, match=f'set model_version = "{fit}"'):
        inspect(_checked(released, name, version))
    assert inspect(_checked(released, name, fit)) is (fit == "klein-4b")


def test_each_family_takes_its_own_model_versions():
    model = ModelSection(pretrained_model_name_or_path="m")
    with pytest.raises(ConfigError, match='model_version = "edit" names no FLUX.2 model; set one '
                       "of dev, klein-4b"):  # fmt: skip
        flux2_family("klein", "4b", False).check_options(model, FlowSection(model_version="edit"))
    with pytest.raises(ConfigError, match='"klein-4b" names no Qwen-Image model; set one of orig'):
        qwenimage_family().check_options(model, FlowSection(model_version="klein-4b"))
    qwenimage_family().check_options(model, FlowSection(model_version="edit"))
