"""The DDP knobs: ddp_static_graph, with and without gradient accumulation.

(gradient checkpointing and ddp_gradient_as_bucket_view are switched on in the 2-process
equivalence runs of test_equivalence.py, so they are checked against single-process weights.)
"""

from tests.distributed.runs import in_process
from tests.integration.harness import assert_close_dicts

LAUNCHES = ["acc1"]


def test_static_graph_without_accumulation_matches_one_process(runs):
    static = runs.schedule("acc1").weights()  # 2 processes x 1, ddp_static_graph = true
    single = runs.schedule("single_acc2").weights()  # 1 process x 2: the same 2 samples per step
    assert_close_dicts(static, single, atol=1e-6, rtol=1e-6)


def test_static_graph_with_accumulation_is_refused_clearly(runs, capsys):
    """With several processes, PyTorch's reducer breaks on no_sync() under static_graph
    (pytorch/pytorch#143580): the first accumulated backward fails an internal assert, and a
    build that gets past it stops syncing gradients. So the config must refuse the combination
    in one line before anything loads; checked on one process (a config rule), which is also
    how a 2-process launch would stop (every process reads the same config)."""
    cfg = runs.equivalence_config("unet-lora", "2x2x1")  # gradient_accumulation_steps = 2
    out = runs.root / "static-acc2"
    run = in_process(cfg, "--ddp_static_graph", "--dry_run", out=out)
    assert run.returncode == 2
    err = capsys.readouterr().err
    assert "ddp_static_graph" in err and "gradient_accumulation_steps" in err, err
