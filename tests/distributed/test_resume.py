"""Saving and resuming with 2 processes, and resuming with another process count.

"acc1" trains 4 steps on 2 processes uninterrupted. "stopped" is the same run, stopped right
after its step-2 save (state included); "resumed" continues it on 2 processes. The state is
also resumed on 1 process with accumulation 2 (same effective batch: must work and match) and
on 1 process with accumulation 1 (another effective batch: must be refused, exit code 2).
"""

import json

from tests.distributed.runs import in_process
from tests.distributed.suite import STOP_AFTER
from tests.integration.harness import assert_close_dicts

LAUNCHES = ["acc1", "stopped", "resumed"]

SAME_LAYOUT_ATOL = 1e-7  # same processes, same order of every sum: only a replay
OTHER_LAYOUT_ATOL, OTHER_LAYOUT_RTOL = 1e-6, 1e-6  # summation order differs (see test_equivalence)


def test_stopped_run_left_a_complete_state(runs):
    stopped = runs.schedule("stopped")
    assert stopped.returncode != 0  # the workers left with 130, as after Ctrl-C
    assert "stopped by the user" in stopped.log
    assert not (stopped.out / "run.safetensors").exists()
    state = runs.stopped_state()
    progress = json.loads((state / "progress.json").read_text(encoding="utf-8"))
    assert progress["global_step"] == STOP_AFTER and progress["world_size"] == 2
    assert progress["effective_batch_sizes"] == [2]
    assert not list(stopped.out.glob("*.tmp*"))  # written atomically, nothing half-done left


def test_two_process_resume_ends_on_the_uninterrupted_weights(runs):
    resumed = runs.schedule("resumed")
    for rank in (0, 1):  # it ran only the remaining steps
        assert len(resumed.rank(rank)["optimizer_lrs"]) == 4 - STOP_AFTER
    straight = runs.schedule("acc1").weights()
    assert_close_dicts(resumed.weights(), straight, atol=SAME_LAYOUT_ATOL)


def test_resume_on_one_process_with_the_same_effective_batch(runs):
    cfg = runs.schedule_config(2)  # 1 process x accumulation 2 = 2 x 1 of the saved run
    run = in_process(cfg, "--resume", str(runs.stopped_state()), out=runs.root / "cross").check()
    assert len(run.rank(0)["optimizer_lrs"]) == 4 - STOP_AFTER
    straight = runs.schedule("acc1").weights()
    assert_close_dicts(run.weights(), straight, atol=OTHER_LAYOUT_ATOL, rtol=OTHER_LAYOUT_RTOL)


def test_resume_with_another_effective_batch_is_refused(runs, capsys):
    cfg = runs.schedule_config(1)  # 1 process x accumulation 1: effective batch 1, saved 2
    run = in_process(cfg, "--resume", str(runs.stopped_state()), out=runs.root / "refused")
    assert run.returncode == 2
    err = capsys.readouterr().err
    assert "effective_batch_sizes" in err and "gradient_accumulation_steps" in err
    assert not (runs.root / "refused" / "run.safetensors").exists()
