"""FSDP2 (fsdp = "full_shard" / "shard_grad_op"): the denoiser really is split, its gradients
are reduced once per optimizer step, and a state saved by sharded processes is the whole state,
resumable with any process count and back into shards.

The weights themselves are compared with one-process runs in test_equivalence.py (the sharded
modes: the suite's fsdp-lora and fsdp-full, and each family's that its kit declares, such as
zimage-fsdp); here the runs are taken apart.
"""

import json

import pytest
import torch

from library.config.optimizer_schema import SHARDABLE_OPTIMIZERS
from tests.distributed.runs import scalars
from tests.distributed.suite import FSDP_PROMPTS, MODES, SHARDED
from tests.integration.harness import assert_close_dicts, tensors

LAUNCHES = [
    *(f"eq-{mode}-2x2x1" for mode in SHARDED),
    "fsdp-resumed",
    "fsdp-data-2x1x1",
    "fsdp-optimizers",
]
ATOL, RTOL = 1e-6, 1e-6
STATE = "run-step00000001-state"


@pytest.mark.parametrize("mode", SHARDED)
def test_each_process_holds_half_of_the_denoiser(runs, mode):
    run = runs.equivalence(mode, "2x2x1")
    fsdp = MODES[mode].keys["fsdp"]
    assert f'the denoiser sharded over them (fsdp = "{fsdp}")' in run.log
    held = []
    for rank in (0, 1):
        sharded = run.rank(rank)["sharded"]
        assert sharded["dtensors"] == sharded["tensors"] > 0
        # dim-0 slices: half of each tensor (the first process takes the odd row)
        assert 0.45 < sharded["local_numel"] / sharded["numel"] < 0.55
        held.append(sharded["local_numel"])
        # the denoiser is not under DDP; a trained text encoder is
        wrapped = [entry["module"] for entry in run.rank(rank)["ddp"]]
        assert wrapped == list(MODES[mode].ddp_modules)
    assert sum(held) == sharded["numel"]  # every element on exactly one process


def test_gradients_are_reduced_once_per_optimizer_step(runs):
    """Accumulation 2: the denoiser's gradients are reduce-scattered in the second micro-batch
    of each window only (the first accumulates them locally)."""
    run = runs.equivalence("fsdp-lora", "2x2x1")
    for rank in (0, 1):
        micros = [
            c["micro"] for c in run.rank(rank)["collectives"] if c["op"] == "reduce_scatter_single"
        ]
        assert micros, "no reduce-scatter recorded"
        assert {m % 2 for m in micros} == {1}
        assert {m // 2 for m in micros} == {0, 1}  # in both optimizer steps


def test_a_sharded_state_holds_the_whole_tensors(runs):
    """The state saved by 2 sharded processes equals the one a single process saved at the same
    step: trained weights and every optimizer tensor, whole."""
    sharded, single = runs.fsdp_state("2x2x1"), runs.fsdp_state("1x4x1")
    assert_close_dicts(
        tensors(sharded / "trained.safetensors"),
        tensors(single / "trained.safetensors"),
        atol=ATOL,
        rtol=RTOL,
    )
    a = torch.load(sharded / "optimizer.pt", weights_only=True)
    b = torch.load(single / "optimizer.pt", weights_only=True)
    assert a["param_groups"] == b["param_groups"]
    assert sorted(a["state"]) == sorted(b["state"]) and a["state"]
    for index, values in b["state"].items():
        for key, value in values.items():
            assert type(a["state"][index][key]) is torch.Tensor  # not a DTensor
            assert a["state"][index][key].shape == value.shape
            torch.testing.assert_close(a["state"][index][key], value, atol=ATOL, rtol=RTOL)


def test_a_sharded_state_resumes_in_one_process_and_in_shards(runs):
    """From the sharded run's step-1 state, one process and two sharded ones both finish with
    the weights of the uninterrupted runs."""
    whole = runs.equivalence("fsdp-lora", "2x2x1").weights()
    single = runs.get("fsdp-resumed-1x4x1").check()
    again = runs.get("fsdp-resumed").check()
    assert "resumed from" in again.log
    assert_close_dicts(single.weights(), whole, atol=ATOL, rtol=RTOL)
    assert_close_dicts(again.weights(), whole, atol=ATOL, rtol=RTOL)
    for rank in (0, 1):  # the resumed processes stepped once, from step 1
        assert len(again.rank(rank)["optimizer_lrs"]) == 1


def test_sharded_validation_and_samples(runs):
    """Sharded, the validation loss and the sample images need every process in each denoiser
    call: the data run (latent cache, validation every step) still matches one process, and
    three prompts of different lengths are drawn after each step, each written once."""
    sharded = runs.get("fsdp-data-2x1x1").check()
    single = runs.get("data-1x2x1").check()
    assert_close_dicts(sharded.weights(), single.weights(), atol=ATOL, rtol=RTOL)
    two = scalars(sharded.out / "logs", "loss/validation")
    one = scalars(single.out / "logs", "loss/validation")
    assert [s for s, _ in two] == [1, 2] == [s for s, _ in one]
    assert [v for _, v in two] == pytest.approx([v for _, v in one], rel=1e-5)
    images = sorted(p.name for p in (sharded.out / "sample").glob("*.png"))
    prompts = len(FSDP_PROMPTS.splitlines())
    grids = [name for name in images if "grid" in name]
    assert len(grids) == 2 and len(images) == 2 * (prompts + 1), images


def test_the_optimizers_allowed_with_fsdp_step_slices_as_whole_tensors(runs):
    """Each optimizer fsdp accepts gives, from its slices, the weights it gives unsharded (6
    steps; one slice padded), so a sharded run's optimizer is the single process's."""
    runs.get("fsdp-optimizers").check()
    result = json.loads((runs.root / "fsdp-optimizers.json").read_text(encoding="utf-8"))
    assert sorted(result) == sorted(SHARDABLE_OPTIMIZERS)
    for name, outcome in result.items():
        assert outcome["moved"] > 1e-4, name
        assert outcome["difference"] <= 1e-6, name
