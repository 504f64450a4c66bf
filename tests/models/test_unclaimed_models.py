"""A model no registered family reads is named for what it is while the plan is made: a
diffusers folder of a pipeline difftune does not train, a folder without a readable
model_index.json, a path that does not exist, a damaged or mislabelled .safetensors file. Only
a model that looks like SD 1.x/2.x/SDXL goes to the SD loader."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from library.config.flow_schema import FlowSection
from library.config.schema import ModelSection
from library.errors import ModelError
from library.models.families.family_choice import entry_for
from library.models.families.registry import families
from tests.integration.harness import make_images, train, write_config
from tests.kits.flux.tiny_files import write_tiny_flux_files

# model_index.json of diffusers pipelines no family trains, as diffusers writes them (the
# part classes are those diffusers' own pipelines declare).
FOREIGN = {
    "HunyuanVideoPipeline": {
        "scheduler": ["diffusers", "FlowMatchEulerDiscreteScheduler"],
        "text_encoder": ["transformers", "LlavaForConditionalGeneration"],
        "text_encoder_2": ["transformers", "CLIPTextModel"],
        "transformer": ["diffusers", "HunyuanVideoTransformer3DModel"],
        "vae": ["diffusers", "AutoencoderKLHunyuanVideo"],
    },
    "StableCascadeCombinedPipeline": {
        "decoder": ["diffusers", "StableCascadeUNet"],
        "prior_prior": ["diffusers", "StableCascadeUNet"],
        "text_encoder": ["transformers", "CLIPTextModelWithProjection"],
        "vqgan": ["diffusers", "PaellaVQModel"],
    },
    # a UNet and CLIP, but not SD's: Kandinsky 2.2 has no text encoder in its decoder folder
    "KandinskyV22Pipeline": {
        "movq": ["diffusers", "VQModel"],
        "unet": ["diffusers", "UNet2DConditionModel"],
    },
}


@pytest.fixture(scope="module")
def flux_folder(kit_folders) -> Path:
    """The session's tiny kit folder (flux dev, seed 0): read only."""
    return kit_folders("flux", "dev")


@pytest.fixture(scope="module")
def flux_file(tmp_path_factory) -> Path:
    return write_tiny_flux_files(tmp_path_factory.mktemp("files"))["transformer"]


def _foreign_folder(flux_folder: Path, root: Path, pipeline: str) -> Path:
    """A complete tiny pipeline folder whose model_index.json names ``pipeline``'s parts."""
    folder = root / pipeline
    shutil.copytree(flux_folder, folder)
    index = {"_class_name": pipeline, "_diffusers_version": "0.36.0", **FOREIGN[pipeline]}
    (folder / "model_index.json").write_text(json.dumps(index), encoding="utf-8")
    return folder


def _error(path: Path, flow: FlowSection | None = None) -> str:
    model = ModelSection(pretrained_model_name_or_path=str(path))
    with pytest.raises(ModelError) as info:
        entry_for(model, flow or FlowSection())
    message = str(info.value)
    assert "\n" not in message
    return message


def _names_every_family(message: str) -> bool:
    return all(line in message for entry in families() for line in entry.lines)


@pytest.mark.parametrize("pipeline", sorted(FOREIGN))
def test_a_pipeline_no_family_reads_is_named(flux_folder, tmp_path, pipeline):
    folder = _foreign_folder(flux_folder, tmp_path, pipeline)
    message = _error(folder)
    assert message.startswith(f"{folder} holds a {pipeline} (model_index.json)")
    assert "no family of difftune reads" in message and _names_every_family(message)
    assert "unet" not in message


@pytest.mark.parametrize("pipeline", ["FluxFillPipeline", "FluxControlPipeline"])
def test_another_pipeline_of_a_familys_transformer_is_refused_by_its_claim(
    flux_folder, tmp_path, pipeline
):
    """Its transformer is FLUX.1's: the family's refusal, while the plan is made."""
    folder = tmp_path / pipeline
    shutil.copytree(flux_folder, folder)
    index = json.loads((folder / "model_index.json").read_text(encoding="utf-8"))
    (folder / "model_index.json").write_text(json.dumps({**index, "_class_name": pipeline}))
    assert _error(folder) == (
        f"{folder} holds a {pipeline}; only text-to-image FLUX.1 (dev or schnell) (FluxPipeline) "
        "can be trained"
    )


def test_the_families_own_folders_are_still_claimed(flux_folder, tiny_model_dir):
    for path, name in ((flux_folder, "flux"), (tiny_model_dir, "sd")):
        model = ModelSection(pretrained_model_name_or_path=str(path))
        assert entry_for(model, FlowSection()).name == name


def test_a_folder_without_a_readable_model_index(flux_folder, tmp_path):
    folder = tmp_path / "m"
    shutil.copytree(flux_folder, folder)
    index = folder / "model_index.json"
    index.write_text('{"_class_name": ', encoding="utf-8")
    assert _error(folder).startswith(f"cannot read {index}: ")
    index.write_text('{"transformer": ["diffusers", "X"]}', encoding="utf-8")
    assert _error(folder).startswith(f"{index} names no pipeline (_class_name)")
    index.unlink()
    assert _error(folder).startswith(f"{folder} has no model_index.json")


def test_a_missing_path_is_said_to_be_missing(tmp_path):
    for path in (tmp_path / "nope", tmp_path / "flux1-dev.safetensors"):
        message = _error(path, FlowSection(ae="ae.safetensors"))  # a FLUX.1 config's key
        assert message.startswith(f"pretrained_model_name_or_path = {path} does not exist")
        assert "SD 1.x" in message and "is an" not in message


def test_a_damaged_flux_file_is_not_an_sd_model(flux_file, tmp_path):
    data = flux_file.read_bytes()
    for size in (4, 60):  # inside the header's length, and a header cut before any key
        path = tmp_path / f"cut{size}.safetensors"
        path.write_bytes(data[:size])
        message = _error(path)
        assert message.startswith(f"{path} is not a valid safetensors file (corrupt or truncated")
        assert "SD 1.x/2.x/SDXL model" not in message


def test_a_pickle_named_safetensors_is_not_read(tmp_path):
    path = tmp_path / "model.safetensors"
    torch.save({"model.diffusion_model.double_blocks.0.img_attn.qkv.weight": torch.zeros(2)}, path)
    message = _error(path)
    assert message.startswith(f"{path} is a pickle")
    assert "does not read pickles" in message and "convert it to safetensors" in message


def test_a_file_of_something_else_says_what_it_holds(tmp_path):
    path = tmp_path / "t5.safetensors"
    save_file({"encoder.block.0.layer.0.SelfAttention.q.weight": torch.zeros(2)}, path)
    assert re.match(rf"{re.escape(str(path))} holds a T5 encoder alone, not a model", _error(path))


@pytest.mark.integration
def test_the_dry_run_answers_before_the_plan(flux_folder, tmp_path, capsys):
    folder = _foreign_folder(flux_folder, tmp_path, "HunyuanVideoPipeline")
    images = make_images(tmp_path / "img", 1)
    config = write_config(tmp_path / "c.toml", folder, images, tmp_path / "out")
    assert train(config, "--dry_run") != 0
    out, err = capsys.readouterr()
    assert "plan" not in out
    errors = re.findall(r"(?m)^error: (.*)$", err)
    assert len(errors) == 1 and errors[0].startswith(f"{folder} holds a HunyuanVideoPipeline")
