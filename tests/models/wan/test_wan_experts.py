"""Wan 2.2 T2V-A14B's two experts load as diffusers' WanPipeline holds them: in a folder,
``transformer`` the high-noise expert and ``transformer_2`` the low-noise one, split at
model_index.json's boundary_ratio; as single files, musubi-tuner's ``dit`` the low-noise one and
``dit_high_noise`` the high-noise one."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from library.config.flow_schema import FlowSection
from library.config.schema import ModelSection
from library.errors import ModelError
from library.models.families.wan.family import load_wan
from tests.kits.wan.tiny import write_tiny_wan_experts_folder
from tests.kits.wan.tiny_files import write_tiny_wan_expert_file, write_tiny_wan_files


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return write_tiny_wan_experts_folder(tmp_path_factory.mktemp("m") / "a14b", 0.9)


def _state(module) -> dict:
    return module.state_dict()


def _assert_same(ours, theirs):
    mine, other = _state(ours), _state(theirs)
    assert mine.keys() == other.keys()
    assert all(torch.equal(mine[k], other[k]) for k in mine)


def test_a_folder_is_the_pipelines_two_experts(folder):
    from diffusers import WanPipeline

    pipe = WanPipeline.from_pretrained(folder, local_files_only=True)
    loaded = load_wan(ModelSection(pretrained_model_name_or_path=str(folder)), FlowSection(),
                      torch.float32, torch.float32)  # fmt: skip
    experts = loaded.experts
    assert experts is not None and experts.boundary_ratio == pipe.config.boundary_ratio == 0.9
    _assert_same(experts.modules["high_noise"], pipe.transformer)
    _assert_same(experts.modules["low_noise"], pipe.transformer_2)
    assert loaded.denoiser is experts.modules["low_noise"]
    assert not torch.equal(*(next(iter(_state(m).values())) for m in experts.modules.values()))


def test_dit_high_noise_beside_a_folder_is_refused(folder):
    with pytest.raises(ModelError, match="dit_high_noise = /m/high.safetensors names the high"):
        load_wan(ModelSection(pretrained_model_name_or_path=str(folder)),
                 FlowSection(dit_high_noise="/m/high.safetensors"), torch.float32, torch.float32)  # fmt: skip


def test_a_wan21_folder_has_one_denoiser(kit_folders):
    folder = kit_folders("wan", "t2v")
    loaded = load_wan(ModelSection(pretrained_model_name_or_path=str(folder)), FlowSection(),
                      torch.float32, torch.float32)  # fmt: skip
    assert loaded.experts is None


def test_single_files_are_musubi_tuners_dit_and_dit_high_noise(folder, tmp_path):
    from diffusers import WanPipeline

    pipe = WanPipeline.from_pretrained(folder, local_files_only=True)
    files = write_tiny_wan_files(tmp_path / "f")
    low = write_tiny_wan_expert_file(folder, "transformer_2", tmp_path / "low.safetensors")
    high = write_tiny_wan_expert_file(folder, "transformer", tmp_path / "high.safetensors")
    model = ModelSection(pretrained_model_name_or_path=str(low), vae=str(files["vae"]))
    flow = {"t5": str(files["t5"]), "t5_tokenizer_path": str(files["tokenizer"])}
    loaded = load_wan(model, FlowSection(**flow, dit_high_noise=str(high)), torch.float32,
                      torch.float32)  # fmt: skip
    _assert_same(loaded.experts.modules["high_noise"], pipe.transformer)
    _assert_same(loaded.experts.modules["low_noise"], pipe.transformer_2)
    assert loaded.experts.boundary_ratio == 0.875  # musubi-tuner's t2v-A14B boundary
    assert load_wan(model, FlowSection(**flow), torch.float32, torch.float32).experts is None
    with pytest.raises(ModelError, match="dit_high_noise = .*nothere.* does not exist"):
        load_wan(model, FlowSection(**flow, dit_high_noise=str(tmp_path / "nothere")),
                 torch.float32, torch.float32)  # fmt: skip


def _pixels(path) -> np.ndarray:
    from PIL import Image

    return np.asarray(Image.open(path).convert("RGB"), dtype=np.int16)


def test_a_sample_is_the_pipelines_own_with_both_experts(folder, tmp_path):
    """sample_images on the loaded experts draws WanPipeline's own image with transformer_2 and
    boundary_ratio; the high-noise transformer alone draws another (both took part); each
    expert keeps its tensors and training flag."""
    from diffusers import WanPipeline

    from library.sampling.generate import sample_images
    from library.sampling.prompts import SamplePrompt

    loaded = load_wan(ModelSection(pretrained_model_name_or_path=str(folder)), FlowSection(),
                      torch.float32, torch.float32)  # fmt: skip
    low = loaded.experts.modules["low_noise"]
    placed = {n: p for n, p in low.named_parameters()}
    loaded.experts.modules["high_noise"].train()
    prompt = SamplePrompt(index=0, prompt="a red cube", seed=3, steps=4, scale=1.0, width=64,
                          height=64, frames=1, negative_prompt="", sampler=None)  # fmt: skip
    done = sample_images(loaded, [prompt], step=0, output_dir=tmp_path / "o", output_name="s")
    ours = _pixels(done.images[0])
    assert loaded.experts.modules["high_noise"].training  # its own mode back
    assert all(p is placed[n] for n, p in low.named_parameters())  # the same tensors kept

    pipe = WanPipeline.from_pretrained(folder, local_files_only=True)
    pipe.set_progress_bar_config(disable=True)

    def theirs(pipe) -> np.ndarray:
        from diffusers import UniPCMultistepScheduler

        pipe.scheduler = UniPCMultistepScheduler.from_config(pipe.scheduler.config)
        out = pipe(prompt="a red cube", negative_prompt="", num_frames=1, width=64, height=64,
                   num_inference_steps=4, guidance_scale=1.0, output_type="pil",
                   generator=torch.Generator().manual_seed(3))  # fmt: skip
        return np.asarray(out.frames[0][0].convert("RGB"), dtype=np.int16)

    assert int(abs(ours - theirs(pipe)).max()) <= 1
    alone = WanPipeline(pipe.tokenizer, pipe.text_encoder, pipe.vae, pipe.scheduler,
                        transformer=pipe.transformer)  # fmt: skip
    alone.set_progress_bar_config(disable=True)
    assert int(abs(ours - theirs(alone)).max()) > 1


def test_samples_switch_experts_at_the_runs_timestep_boundary(folder, tmp_path):
    """With timestep_boundary set (musubi-tuner's 0-1000 scale), the trainer's SampleRunner
    draws WanPipeline's own sample at that boundary_ratio, not at the folder's 0.9."""
    from diffusers import UniPCMultistepScheduler, WanPipeline

    from library.config.loader import load_config
    from library.sampling.runner import SampleRunner

    (tmp_path / "p.txt").write_text("a red cube --w 64 --h 64 --s 4 --l 1 --d 3 --f 1\n")
    (tmp_path / "c.toml").write_text(
        f'pretrained_model_name_or_path = "{folder}"\noutput_dir = "{tmp_path / "o"}"\n'
        f'sample_prompts = "{tmp_path / "p.txt"}"\nsample_at_first = true\n'
        "[experts]\ntimestep_boundary = 500\n"
        '[[datasets]]\n[[datasets.subsets]]\nimage_dir = "img"\n', encoding="utf-8")  # fmt: skip
    loaded = load_wan(ModelSection(pretrained_model_name_or_path=str(folder)), FlowSection(),
                      torch.float32, torch.float32)  # fmt: skip
    runner = SampleRunner(load_config(str(tmp_path / "c.toml")))
    runner.attach(loaded)
    ours = _pixels(runner.at_start(0).images[0])

    pipe = WanPipeline.from_pretrained(folder, local_files_only=True)
    pipe.set_progress_bar_config(disable=True)

    def theirs(ratio: float) -> np.ndarray:
        split = WanPipeline(pipe.tokenizer, pipe.text_encoder, pipe.vae,
                            UniPCMultistepScheduler.from_config(pipe.scheduler.config),
                            transformer=pipe.transformer, transformer_2=pipe.transformer_2,
                            boundary_ratio=ratio)  # fmt: skip
        split.set_progress_bar_config(disable=True)
        out = split(prompt="a red cube", negative_prompt="", num_frames=1, width=64, height=64,
                    num_inference_steps=4, guidance_scale=1.0, output_type="pil",
                    generator=torch.Generator().manual_seed(3))  # fmt: skip
        return np.asarray(out.frames[0][0].convert("RGB"), dtype=np.int16)

    assert int(abs(ours - theirs(0.5)).max()) <= 1
    assert int(abs(ours - theirs(0.9)).max()) > 1  # the folder's own boundary draws another
