"""Wan 2.2 TI2V-5B from the single files users have (Comfy-Org's wan2.2_ti2v_5B_fp16.safetensors
in the original names, bare or under ``model.diffusion_model.``, and wan2.2_vae.safetensors in
the names of Wan-AI's Wan 2.2 VAE code, beside umT5's file): the same transformer and VAE as
the diffusers folder's, TI2V-5B's family (per-token timesteps, 24 fps, the 32-pixel grid) and
its released sampling shift, musubi-tuner's task word checked."""

from __future__ import annotations

import pytest
import torch

from library.config.flow_schema import FlowSection
from library.config.schema import ModelSection
from library.errors import ModelError
from library.models.families.wan.family import WanFamily, WanTi2vFamily, family_class
from library.models.families.wan.spec import TI2V_SAMPLE_SHIFT
from library.models.loader import load_components
from tests.kits.wan.tiny import write_tiny_wan_ti2v_folder
from tests.kits.wan.tiny_files import write_tiny_wan_files, write_tiny_wan_ti2v_files


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return write_tiny_wan_ti2v_folder(tmp_path_factory.mktemp("models") / "ti2v")


def _load(files, **flow):
    model = ModelSection(pretrained_model_name_or_path=str(files["transformer"]),
                         vae=str(files["vae"]))  # fmt: skip
    flow = FlowSection(t5=str(files["t5"]), t5_tokenizer_path=str(files["tokenizer"]), **flow)
    return load_components(model, torch.float32, flow)


def _assert_same(ours, theirs):
    got, expected = ours.state_dict(), theirs.state_dict()
    assert got.keys() == expected.keys()
    assert all(torch.equal(got[k], expected[k]) for k in expected)


@pytest.mark.parametrize("comfy", [False, True])
def test_the_files_load_as_the_folder(folder, tmp_path, comfy):
    from diffusers import WanPipeline

    pipe = WanPipeline.from_pretrained(folder, local_files_only=True)
    files = write_tiny_wan_ti2v_files(tmp_path, comfy=comfy)
    components = _load(files)
    _assert_same(components.denoiser, pipe.transformer)
    _assert_same(components.vae, pipe.vae)
    assert isinstance(components.family, WanTi2vFamily) and components.family.FRAME_RATE == 24.0
    assert components.objective.sampling_scheduler["flow_shift"] == TI2V_SAMPLE_SHIFT


def test_the_task_word_is_checked(folder, tmp_path):
    files = write_tiny_wan_ti2v_files(tmp_path)
    with pytest.raises(ModelError, match="task = 't2v-1.3B' is a 1536-wide Wan transformer"):
        _load(files, task="t2v-1.3B")


def test_the_class_data_comes_from_the_files_header_before_any_weight(folder, tmp_path):
    """The 24 fps and 32-pixel grid the checks before loading use: a transformer file on 48
    channels is TI2V-5B's, a Wan 2.1 one is not."""
    ti2v = write_tiny_wan_ti2v_files(tmp_path / "ti2v", comfy=True)["transformer"]
    t2v = write_tiny_wan_files(tmp_path / "t2v")["transformer"]
    for path, expected in ((ti2v, WanTi2vFamily), (t2v, WanFamily)):
        model = ModelSection(pretrained_model_name_or_path=str(path))
        assert family_class(model, FlowSection()) is expected
