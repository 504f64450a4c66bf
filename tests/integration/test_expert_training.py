"""A model with two denoiser experts trains through the real CLI (the made-up Toy family given
a second transformer, as Wan 2.2's A14B folders hold one): one LoRA file per expert, each naming
its expert and noise levels, each holding the family's modules, each trained; the plan and
--dry_run --json show the split; the same weights whether a step's samples come as one batch or
as accumulated micro-batches, and after a stop and resume; a file given to the other expert as
network_weights is refused by name."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors import safe_open

from library.models.families import registry
from tests.integration.harness import (
    assert_close_dicts,
    check_accumulation_and_resume,
    make_images,
    tensors,
    train,
    write_config,
)
from tests.integration.test_dry_run_json import cli
from tests.kits.toy.entry import TOY_ENTRY
from tests.kits.toy.tiny import write_tiny_toy_experts_folder

EXPERTS = ("high_noise", "low_noise")
COMMON = {
    "network_module": "networks.lora",
    "network_train_unet_only": True,
    "bucket_reso_steps": 16,
    "learning_rate": 1e-2,
    "model_prediction_type": "raw",
    "timestep_sampling": "uniform",
    "timestep_boundary": 600,  # musubi-tuner's 0-1000 scale: 0.6
}


@pytest.fixture(autouse=True)
def toy():
    with registry.registered(TOY_ENTRY):
        yield


@pytest.fixture
def model(tmp_path):
    return write_tiny_toy_experts_folder(tmp_path / "toy", boundary_ratio=0.875)


def _files(out) -> dict[str, dict[str, torch.Tensor]]:
    return {e: tensors(out / f"run_{e}.safetensors") for e in EXPERTS}


def moved(saved: dict[str, torch.Tensor]) -> bool:
    """Whether a LoRA trained: its up factors start at zero."""
    ups = [key for key in saved if key.endswith(".lora_up.weight")]
    return bool(ups) and all(saved[key].abs().sum() > 0 for key in ups)


def _header(path) -> dict[str, str]:
    with safe_open(str(path), framework="pt") as file:
        return file.metadata()


def test_both_experts_train_into_a_file_each(model, tmp_path, capfd):
    images = make_images(tmp_path / "imgs", 2, size=64)
    out = tmp_path / "out"
    config = write_config(tmp_path / "c.toml", model, images, out, max_train_steps=8,
                          train_batch_size=2, **COMMON)  # fmt: skip
    code, plan_out, err = cli(capfd, "--config", config, "--dry_run", "--json")
    assert code == 0, err
    split = json.loads(plan_out)["experts"]
    assert split["boundary"] == pytest.approx(0.6)  # the config's, not the model's 0.875
    assert [(e["name"], e["noise_levels"]) for e in split["experts"]] == [
        ("high_noise", [0.6, 1.0]), ("low_noise", [0.0, 0.6])
    ]  # fmt: skip
    assert sum(e["share_of_steps"] for e in split["experts"]) == pytest.approx(1.0)

    assert train(config) == 0
    assert "expert high_noise: noise levels [0.6, 1]" in capfd.readouterr().out
    assert not (out / "run.safetensors").exists()
    files = _files(out)
    assert set(files["high_noise"]) == set(files["low_noise"])  # the family's modules in each
    for expert, saved in files.items():
        header = _header(out / f"run_{expert}.safetensors")
        assert header["ss_expert"] == expert
        assert moved(saved), expert
    assert _header(out / "run_low_noise.safetensors")["ss_expert_noise_levels"] == "[0, 0.6)"

    # the high-noise file given to a low-noise run: refused by name before training
    again = write_config(tmp_path / "d.toml", model, images, tmp_path / "out2", max_train_steps=1,
                         train_experts="low_noise", network_weights=str(out / "run_high_noise.safetensors"),
                         **COMMON)  # fmt: skip
    code, _, err = cli(capfd, "--config", again, "--dry_run")
    assert code != 0
    assert "is a LoRA of the high_noise expert and this run trains the low_noise expert" in err
    # given to a run of its own expert it starts that expert's adapter: the one file written
    # starts from it (one step at a tiny rate moves it a little)
    own = write_config(tmp_path / "e.toml", model, images, tmp_path / "out3", max_train_steps=1,
                       train_experts="high_noise", network_weights=str(out / "run_high_noise.safetensors"),
                       **{**COMMON, "learning_rate": 1e-6})  # fmt: skip
    assert train(own) == 0
    assert sorted(p.name for p in (tmp_path / "out3").glob("*.safetensors")) == [
        "run_high_noise.safetensors"
    ]
    assert_close_dicts(
        tensors(tmp_path / "out3" / "run_high_noise.safetensors"), files["high_noise"], 1e-4
    )


def test_expert_runs_are_layout_invariant_and_resume_exactly(model, tmp_path, monkeypatch):
    """4 samples a step as one batch of 4 and as 2 x 2 accumulated micro-batches (each
    micro-batch of a step on the same expert, its samples at the same levels), and a run
    stopped after its step-1 save and resumed: the same two files, each trained."""
    images = make_images(tmp_path / "imgs", 4, size=64)

    def make_config(folder, out, **keys):
        return write_config(folder / "c.toml", model, images, out, **keys)

    common = {**COMMON, "max_train_steps": 3, "train_batch_size": 4}
    # summation order is all that differs (a step on the other expert moves weights by ~lr)
    names = tuple(f"run_{e}.safetensors" for e in EXPERTS)
    check_accumulation_and_resume(tmp_path, make_config, common, monkeypatch, names, (1e-5, 1e-5))
    assert all(moved(saved) for saved in _files(tmp_path / "one").values())  # both had steps


def test_the_estimate_counts_the_other_expert_unless_it_waits_in_host_memory(
    model, tmp_path, capfd
):
    """Both experts on the device hold one transformer's frozen weights more than with
    offload_inactive_dit (the bytes of the tiny transformer, counted here), and one transformer
    with its adapter more than a run training one expert."""
    from diffusers import BriaTransformer2DModel

    from tests.kits.toy.tiny import tiny_transformer_config

    images = make_images(tmp_path / "imgs", 2, size=64)

    def weights(name, **keys) -> int:
        config = write_config(tmp_path / f"{name}.toml", model, images, tmp_path / name,
                              max_train_steps=1, **COMMON, **keys)  # fmt: skip
        code, out, err = cli(capfd, "--config", config, "--dry_run", "--json")
        assert code == 0, err
        return json.loads(out)["memory"]["weights_bytes"]

    one = sum(
        p.numel() * 4 for p in BriaTransformer2DModel(**tiny_transformer_config()).parameters()
    )
    both = weights("both")
    assert both - weights("offload", offload_inactive_dit=True) == one
    adapter = both - weights("high", train_experts="high_noise") - one
    assert 0 < adapter < one / 4  # rank 4 on width-32 Linears


@pytest.mark.parametrize("kind", ["full", "loha"])
def test_a_full_fine_tune_and_lycoris_write_a_file_per_expert(model, tmp_path, kind):
    """Each expert's file holds what that run kind writes (the transformer in Toy's original
    names; LyCORIS LoHa factors), names its expert, and differs from the other's."""
    from tests.kits.toy.tiny import write_tiny_toy_files

    images = make_images(tmp_path / "imgs", 2, size=64)
    keys = {**COMMON, "max_train_steps": 4, "train_batch_size": 2}
    if kind == "full":
        for key in ("network_module", "network_train_unet_only"):
            keys.pop(key)
        keys.update(train_mode="unet", learning_rate=1e-4)
    else:
        keys.update(network_module="lycoris.kohya", network_args=["algo=loha"])
    out = tmp_path / "out"
    assert train(write_config(tmp_path / "c.toml", model, images, out, **keys)) == 0
    files = _files(out)
    if kind == "full":  # each file is its own expert, trained: not the base it started from
        from diffusers import BriaTransformer2DModel

        from tests.kits.toy.spec import TABLE

        assert set(files["high_noise"]) == set(
            tensors(write_tiny_toy_files(tmp_path / "f")["transformer"])
        )
        for expert, sub in (("high_noise", "transformer"), ("low_noise", "transformer_2")):
            base = TABLE.to_original(
                BriaTransformer2DModel.from_pretrained(model / sub).state_dict()
            )
            changed = [k for k, v in files[expert].items() if not torch.equal(v, base[k])]
            assert changed, expert
            # near its own base (a file of the other expert is ~0.1 away)
            assert all((files[expert][k] - base[k]).abs().max() < 1e-2 for k in base), expert
    else:
        assert any(key.endswith(".hada_w1_a") for key in files["high_noise"])
    assert set(files["high_noise"]) == set(files["low_noise"])
    for expert in EXPERTS:
        assert _header(out / f"run_{expert}.safetensors")["ss_expert"] == expert
