"""A family that exists only as a spec and a small class (tests/kits/toy/: "Toy", diffusers'
BriaTransformer2DModel under a made-up ToyPipeline and made-up original names), registered
inside the test: the registry's claims pick its folder and its single file and not another
family's (nor does any family claim them while it is not registered), and the shared loader
reads the single files (original names, no config in the header) as the folder, tensor for
tensor. tests/integration/test_made_up_family_training.py trains it through the CLI; together
they are the worked example of docs/design.md's "Adding a family"."""

from __future__ import annotations

import pytest
import torch

from library.config.flow_schema import FlowSection
from library.config.schema import ModelSection
from library.errors import ModelError
from library.models.families import registry
from library.models.families.family_choice import entry_for
from tests.kits.chroma.tiny import write_tiny_chroma_folder
from tests.kits.chroma.tiny_files import write_tiny_chroma_files
from tests.kits.toy.entry import TOY_ENTRY
from tests.kits.toy.family import load_toy
from tests.kits.toy.tiny import write_tiny_toy_files, write_tiny_toy_folder


@pytest.fixture(scope="module")
def toy(tmp_path_factory):
    root = tmp_path_factory.mktemp("toy")
    return write_tiny_toy_folder(root / "folder"), write_tiny_toy_files(root / "files")


@pytest.fixture
def registered():
    with registry.registered(TOY_ENTRY):
        yield TOY_ENTRY


def _model(path) -> ModelSection:
    return ModelSection(pretrained_model_name_or_path=str(path))


def _file_flow(files) -> FlowSection:
    return FlowSection(t5xxl=str(files["t5xxl"]), ae=str(files["ae"]),
                       t5_tokenizer_path=str(files["t5_tokenizer"]))  # fmt: skip


def test_claims_pick_its_folder_and_file_and_no_other(toy, tmp_path, registered):
    folder, files = toy
    chroma_folder = write_tiny_chroma_folder(tmp_path / "chroma")
    chroma_file = write_tiny_chroma_files(tmp_path / "chroma_files")["transformer"]
    flow = FlowSection()
    for own in (folder, files["transformer"]):
        assert entry_for(_model(own), flow) is TOY_ENTRY
        # no registered family claims it either, SD's claim (asked after Toy's) included
        assert not [entry.name for entry in registry.FAMILIES if entry.claims(_model(own), flow)]
    for other in (chroma_folder, chroma_file):
        assert not TOY_ENTRY.claims(_model(other), flow)
        assert entry_for(_model(other), flow).name == "chroma"
    # the T5 and AE files are no family's model
    assert not TOY_ENTRY.claims(_model(files["t5xxl"]), flow)


def test_unregistered_no_family_claims_it(toy):
    with pytest.raises(ModelError):
        entry_for(_model(toy[0]), FlowSection())


def _public(config) -> dict:
    return {k: list(v) if isinstance(v, tuple) else v for k, v in dict(config).items()
            if not k.startswith("_")}  # fmt: skip


def test_the_single_file_loads_as_the_folder(toy):
    folder, files = toy
    a = load_toy(_model(folder), FlowSection(), torch.float32, torch.float32)
    b = load_toy(_model(files["transformer"]), _file_flow(files), torch.float32, torch.float32)
    # the file has no config in its header: the spec's config_from_shapes found it
    assert _public(b.denoiser.config) == _public(a.denoiser.config)
    for x, y in (
        (a.denoiser, b.denoiser),
        (a.vae, b.vae),
        (a.text_encoders[0], b.text_encoders[0]),
    ):
        sa, sb = x.state_dict(), y.state_dict()
        assert sa.keys() == sb.keys()
        for key in sa:
            assert torch.equal(sa[key], sb[key]), key
    ids = [t("a red circle").input_ids for t in (*a.tokenizers, *b.tokenizers)]
    assert ids[0] == ids[1]
