"""Chroma from single files (the transformer in the original names, FLUX.1's t5xxl and ae files,
T5's tokenizer folder): the same modules as diffusers' pipeline reads from the folder written
under the same seed, with the config from the header or from the shapes, and a prefixed full
checkpoint too; missing or wrong files are refused by name."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from library.config.flow_schema import FlowSection
from library.config.schema import ModelSection
from library.errors import ModelError
from library.models.families.family_choice import entry_for
from library.models.loader import load_components
from tests.kits.chroma.tiny import write_tiny_chroma_folder
from tests.kits.chroma.tiny_files import write_tiny_chroma_files


@pytest.fixture(scope="module")
def pipe(tmp_path_factory):
    from diffusers import ChromaPipeline

    folder = write_tiny_chroma_folder(tmp_path_factory.mktemp("models") / "tiny-chroma")
    return ChromaPipeline.from_pretrained(folder, local_files_only=True)


def _flow(files) -> FlowSection:
    return FlowSection(t5xxl=str(files["t5xxl"]), ae=str(files["ae"]),
                       t5_tokenizer_path=str(files["t5_tokenizer"]))  # fmt: skip


def _public(config) -> dict:
    return {k: tuple(v) if isinstance(v, list) else v for k, v in config.items() if k[0] != "_"}


def _assert_same(module, reference):
    ours, theirs = module.state_dict(), reference.state_dict()
    assert set(ours) == set(theirs)
    for key, value in theirs.items():
        assert torch.equal(ours[key], value), key


@pytest.mark.parametrize("metadata", [True, False], ids=["header-config", "shapes"])
def test_single_files_load_what_the_pipeline_loads(tmp_path, pipe, metadata):
    files = write_tiny_chroma_files(tmp_path, config_metadata=metadata)
    model = ModelSection(pretrained_model_name_or_path=str(files["transformer"]))
    assert entry_for(model, _flow(files)).name == "chroma"
    c = load_components(model, torch.float32, _flow(files))
    assert _public(c.denoiser.config) == _public(pipe.transformer.config)
    for module, reference in ((c.denoiser, pipe.transformer), (c.vae, pipe.vae),
                              (c.text_encoders[0], pipe.text_encoder)):  # fmt: skip
        assert type(module) is type(reference)
        _assert_same(module, reference)
        assert not module.training and not any(p.requires_grad for p in module.parameters())
    assert c.tokenizers[0]("a cat").input_ids == pipe.tokenizer("a cat").input_ids
    assert c.family.name == "chroma"


def test_a_full_checkpoint_prefix_is_read(tmp_path, pipe):
    files = write_tiny_chroma_files(tmp_path, config_metadata=False)
    state = load_file(str(files["transformer"]))
    prefixed = tmp_path / "full.safetensors"
    save_file({f"model.diffusion_model.{k}": v for k, v in state.items()}, str(prefixed))
    model = ModelSection(pretrained_model_name_or_path=str(prefixed))
    c = load_components(model, torch.float32, _flow(files))
    _assert_same(c.denoiser, pipe.transformer)


def test_missing_and_wrong_files_are_refused_by_name(tmp_path):
    files = write_tiny_chroma_files(tmp_path)
    model = ModelSection(pretrained_model_name_or_path=str(files["transformer"]))
    with pytest.raises(ModelError, match="needs the T5-XXL text encoder.*set t5xxl"):
        load_components(model, torch.float32, FlowSection(ae=str(files["ae"])))
    with pytest.raises(ModelError, match="ae = .* is not a file"):
        load_components(model, torch.float32, FlowSection(t5xxl=str(files["t5xxl"]),
                                                          ae=str(tmp_path / "none.safetensors")))  # fmt: skip
    config = json.loads(load_file_metadata(files["transformer"])["difftune.config.transformer"])
    assert config["num_layers"] == 2


def load_file_metadata(path):
    from safetensors import safe_open

    with safe_open(str(path), "pt") as f:
        return f.metadata()
