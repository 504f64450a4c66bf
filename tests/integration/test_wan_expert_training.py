"""Wan 2.2 T2V-A14B's two experts trained through the CLI on a tiny A14B-shaped WanPipeline
folder: one run of both writes one LoRA per expert, each applied exactly by diffusers'
WanPipeline.load_lora_weights (the low-noise file into transformer_2 with
load_into_transformer_2=True), each expert's transformer run only at noise levels of its own
range (split at the folder's boundary_ratio), the same files whether a step's samples come as
one batch or accumulated, and after a stop and resume; a run of one expert writes only its
file; the other expert's file as network_weights is refused by name."""

from __future__ import annotations

import json

import pytest
import torch

from library.models.families.wan import family as wan_family
from tests.integration.harness import (
    check_accumulation_and_resume,
    make_images,
    tensors,
    train,
    write_config,
)
from tests.integration.test_dry_run_json import cli
from tests.integration.test_wan_training import BLOCK_LINEARS, _musubi_args
from tests.kits.wan.tiny import write_tiny_wan_experts_folder
from tests.kits.wan.tiny_files import write_tiny_wan_expert_file, write_tiny_wan_files

BOUNDARY = 0.7  # the folder's boundary_ratio: the run's split, no timestep_boundary set
COMMON = {
    "network_module": "networks.lora_wan", "network_train_unet_only": True,
    "bucket_reso_steps": 16, "timestep_sampling": "shift", "discrete_flow_shift": 3.0,
    "mixed_precision": "no",
}  # fmt: skip
SUBS = {"high_noise": "transformer", "low_noise": "transformer_2"}


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return write_tiny_wan_experts_folder(tmp_path_factory.mktemp("m") / "a14b", BOUNDARY)


@pytest.fixture
def levels(monkeypatch):
    """Each expert's noise levels (timestep / 1000) of every transformer call, by expert: the
    loaded experts are tagged with their names, and the family's predict records."""
    seen: dict[str, list[float]] = {}
    real_experts, real_predict = wan_family.folder_experts, wan_family.WanFamily.predict

    def tagged(*args):
        experts = real_experts(*args)
        for name, module in experts.modules.items():
            module.expert_name = name
        return experts

    def recording(self, denoiser, noisy, timesteps, cond):
        name = getattr(denoiser, "module", denoiser).expert_name
        seen.setdefault(name, []).extend((timesteps / 1000).tolist())
        return real_predict(self, denoiser, noisy, timesteps, cond)

    monkeypatch.setattr(wan_family, "folder_experts", tagged)
    monkeypatch.setattr(wan_family.WanFamily, "predict", recording)
    return seen


def _assert_applied_exactly(pipe, path, sub: str, linears=BLOCK_LINEARS, **load) -> None:
    """Every module of the file fused into ``pipe``'s ``sub`` transformer as base + alpha / r
    * up @ down, and nothing else changed; the file holds ``linears`` of every block."""
    saved = tensors(path)
    model = getattr(pipe, sub)
    base = {n: p.detach().clone() for n, p in model.named_parameters()}
    pipe.load_lora_weights(str(path), **load)
    pipe.fuse_lora(components=[sub], lora_scale=1.0)
    fused = {n.replace(".base_layer", ""): p for n, p in model.named_parameters()
             if "lora_" not in n}  # fmt: skip
    expected = dict(base)
    for module in {k.split(".", 1)[0] for k in saved}:
        down, up = saved[f"{module}.lora_down.weight"], saved[f"{module}.lora_up.weight"]
        block, linear = module.removeprefix("lora_unet_blocks_").split("_", 1)
        weight = f"blocks.{block}.{linears[linear]}.weight"
        alpha = saved[f"{module}.alpha"].item()
        expected[weight] = base[weight] + alpha / down.shape[0] * (up.float() @ down.float())
    assert len(saved) == 3 * 2 * len(linears)  # down, up, alpha of each per block
    for name, weight in expected.items():
        torch.testing.assert_close(fused[name], weight, rtol=1e-5, atol=1e-6, msg=name)


def test_both_experts_train_each_on_its_range_into_files_diffusers_apply(
    folder, tmp_path, levels, capfd
):
    from diffusers import WanPipeline

    images = make_images(tmp_path / "imgs", 2, size=64)
    out = tmp_path / "out"
    config = write_config(tmp_path / "c.toml", folder, images, out, max_train_steps=8,
                          train_batch_size=2, **COMMON)  # fmt: skip
    code, plan, err = cli(capfd, "--config", config, "--dry_run", "--json")
    assert code == 0, err
    split = json.loads(plan)["experts"]
    assert [(e["name"], e["noise_levels"]) for e in split["experts"]] == [
        ("high_noise", [BOUNDARY, 1.0]), ("low_noise", [0.0, BOUNDARY])
    ]  # fmt: skip
    assert train(config) == 0
    assert f"expert high_noise: noise levels [{BOUNDARY:g}, 1]" in capfd.readouterr().out
    assert set(levels) == set(SUBS)  # both had steps, each on its own range only
    assert min(levels["high_noise"]) >= BOUNDARY
    assert max(levels["low_noise"]) < BOUNDARY
    assert sorted(p.name for p in out.glob("*.safetensors")) == [
        "run_high_noise.safetensors", "run_low_noise.safetensors"
    ]  # fmt: skip
    for expert, sub in SUBS.items():
        pipe = WanPipeline.from_pretrained(folder, local_files_only=True)
        load = {"load_into_transformer_2": True} if sub == "transformer_2" else {}
        _assert_applied_exactly(pipe, out / f"run_{expert}.safetensors", sub, **load)

    # the high-noise file given to a low-noise run: refused by name before training
    wrong = write_config(tmp_path / "d.toml", folder, images, tmp_path / "out2",
                         max_train_steps=1, train_experts="low_noise",
                         network_weights=str(out / "run_high_noise.safetensors"), **COMMON)  # fmt: skip
    code, _, err = cli(capfd, "--config", wrong, "--dry_run")
    assert code != 0
    assert "is a LoRA of the high_noise expert and this run trains the low_noise expert" in err


def test_a_one_expert_run_trains_and_writes_only_that_expert(folder, tmp_path, levels):
    images = make_images(tmp_path / "imgs", 2, size=64)
    out = tmp_path / "out"
    config = write_config(tmp_path / "c.toml", folder, images, out, max_train_steps=3,
                          train_batch_size=2, train_experts="low_noise", **COMMON)  # fmt: skip
    assert train(config) == 0
    assert set(levels) == {"low_noise"} and max(levels["low_noise"]) < BOUNDARY
    assert [p.name for p in out.glob("*.safetensors")] == ["run_low_noise.safetensors"]


def test_a_per_expert_run_with_preserve_distribution_shape_trains_in_min_max_only(
    folder, tmp_path, levels, capfd
):
    """musubi-tuner users' high-noise run: min_timestep inside the expert's range, the level
    drawn again until it lies there; a range the draw never reaches is refused by the dry run."""
    images = make_images(tmp_path / "imgs", 2, size=64)
    words = {**COMMON, "train_experts": "high_noise", "preserve_distribution_shape": True}
    config = write_config(tmp_path / "c.toml", folder, images, tmp_path / "out",
                          max_train_steps=2, train_batch_size=2, min_timestep=850, **words)  # fmt: skip
    assert train(config) == 0
    assert set(levels) == {"high_noise"} and min(levels["high_noise"]) >= 0.85
    never = write_config(tmp_path / "d.toml", folder, images, tmp_path / "out2",
                         max_train_steps=1, min_timestep=900, max_timestep=900, **words)  # fmt: skip
    code, _, err = cli(capfd, "--config", never, "--dry_run")
    assert code != 0 and "preserve_distribution_shape" in err and "falls 0.0%" in err


def test_musubi_tuners_dit_and_dit_high_noise_plan_two_experts(folder, tmp_path, capfd):
    """musubi-tuner's args: dit the low-noise file, dit_high_noise the high-noise one; the dry
    run plans both experts at its T2V-A14B boundary 0.875, or at its timestep_boundary."""
    files = write_tiny_wan_files(tmp_path / "f")
    low = write_tiny_wan_expert_file(folder, "transformer_2", tmp_path / "low.safetensors")
    high = write_tiny_wan_expert_file(folder, "transformer", tmp_path / "high.safetensors")
    for extra, boundary in (({}, 0.875), ({"timestep_boundary": 600}, 0.6)):
        args = _musubi_args(tmp_path, {**files, "transformer": low}, dit_high_noise=str(high),
                            **extra)  # fmt: skip
        code, plan, err = cli(capfd, "--config", args, "--dry_run", "--json")
        assert code == 0, err
        assert json.loads(plan)["experts"]["boundary"] == pytest.approx(boundary)


def test_a14b_runs_are_layout_invariant_and_resume_exactly(folder, tmp_path, monkeypatch):
    """4 samples a step as one batch and as 2 x 2 accumulated micro-batches, and a run stopped
    after its step-1 save and resumed: the same two files."""
    images = make_images(tmp_path / "imgs", 4, size=64)

    def make_config(where, out, **keys):
        return write_config(where / "c.toml", folder, images, out, **keys)

    common = {**COMMON, "max_train_steps": 3, "train_batch_size": 4}
    names = tuple(f"run_{e}.safetensors" for e in SUBS)
    check_accumulation_and_resume(tmp_path, make_config, common, monkeypatch, names, (1e-5, 1e-5))
