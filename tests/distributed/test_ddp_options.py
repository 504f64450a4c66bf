"""The DDP knobs: ddp_static_graph, with and without gradient accumulation.

(gradient checkpointing and ddp_gradient_as_bucket_view are switched on in the 2-process
equivalence runs of test_equivalence.py, so they are checked against single-process weights.)
"""

from tests.integration.harness import assert_close_dicts

LAUNCHES = ["acc1", "static-acc2"]


def test_static_graph_without_accumulation_matches_one_process(runs):
    static = runs.schedule("acc1").weights()  # 2 processes x 1, ddp_static_graph = true
    single = runs.schedule("single_acc2").weights()  # 1 process x 2: the same 2 samples per step
    assert_close_dicts(static, single, atol=1e-6, rtol=1e-6)


def test_static_graph_with_accumulation_is_refused_clearly(runs):
    """PyTorch's reducer breaks on no_sync() under static_graph (pytorch/pytorch#143580): the
    first accumulated backward fails an internal assert, and a build that gets past it stops
    syncing gradients. The trainer must refuse the combination in one line, before training."""
    run = runs.get("static-acc2")  # the unet-lora 2x2x1 config (accumulation 2) + the option
    assert run.returncode != 0
    assert "INTERNAL ASSERT" not in run.log
    errors = [line for line in run.log.splitlines() if line.startswith("error:")]
    assert errors and "ddp_static_graph" in errors[0], run.log[-3000:]
    assert not (run.out / "run.safetensors").exists()
