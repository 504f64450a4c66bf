"""Stopping, saving and resuming with 2 processes, and resuming with another process count.

"acc1" trains 4 steps on 2 processes uninterrupted. "stopped" is the same run saving a state
every 2 steps, where only rank 1 receives SIGINT right after step 2: both processes must agree
to stop at the end of step 3 and leave a step-3 state. "resumed" continues that state on 2
processes. The step-2 state is also resumed on 1 process with accumulation 2 (same effective
batch: must work and match) and on 1 process with accumulation 1 (another effective batch:
must be refused, exit code 2).

The modes that declare ``resume`` (DistributedMode.resume in a family's kit, such as Z-Image's
LoRA on captions of four lengths): the 2-process run continued from the state its own first
step saved, on 2 processes and on 1 process x accumulation 4, ends on the uninterrupted run's
weights.
"""

import json

import pytest

from tests.distributed.runs import in_process, scalars
from tests.distributed.suite import RESUMED, SAVE_EVERY, STOPPED_AT
from tests.integration.harness import assert_close_dicts

LAUNCHES = [
    "acc1",
    "stopped",
    "resumed",
    *(name for mode in RESUMED for name in (f"eq-{mode}-2x2x1", f"{mode}-resumed")),
]
STEPS = 4
SAME_LAYOUT_ATOL = 1e-7  # same processes, same order of every sum: only a replay
OTHER_LAYOUT_ATOL, OTHER_LAYOUT_RTOL = 1e-6, 1e-6  # summation order differs (see test_equivalence)


def _progress(state) -> dict:
    return json.loads((state / "progress.json").read_text(encoding="utf-8"))


def test_a_signal_to_one_process_stops_both_with_a_state(runs):
    stopped = runs.schedule("stopped")
    assert stopped.returncode != 0  # the workers leave with 128 + SIGINT
    assert f"after optimizer step {STOPPED_AT}" in stopped.log, stopped.log[-3000:]
    for rank in (0, 1):  # both processes trained exactly up to the agreed step
        assert len(stopped.rank(rank)["optimizer_lrs"]) == STOPPED_AT
    assert not (stopped.out / "run.safetensors").exists()
    for step in (SAVE_EVERY, STOPPED_AT):
        progress = _progress(runs.stopped_state(step))
        assert progress["global_step"] == step and progress["world_size"] == 2
        assert progress["effective_batch_sizes"] == [2]
    assert not list(stopped.out.glob("*.tmp*"))  # states are renamed into place when complete


def test_two_process_resume_ends_on_the_uninterrupted_weights(runs):
    resumed = runs.schedule("resumed")  # launched as train_network.py, without a probe
    logged = scalars(resumed.out / "logs", "loss/step")
    assert [step for step, _ in logged] == list(range(STOPPED_AT + 1, STEPS + 1))
    straight = runs.schedule("acc1").weights()
    assert_close_dicts(resumed.weights(), straight, atol=SAME_LAYOUT_ATOL)


def test_resume_on_one_process_with_the_same_effective_batch(runs):
    cfg = runs.schedule_config(2)  # 1 process x accumulation 2 = 2 x 1 of the saved run
    state = runs.stopped_state(SAVE_EVERY)
    run = in_process(cfg, "--resume", str(state), out=runs.root / "cross").check()
    assert len(run.rank(0)["optimizer_lrs"]) == STEPS - SAVE_EVERY
    straight = runs.schedule("acc1").weights()
    assert_close_dicts(run.weights(), straight, atol=OTHER_LAYOUT_ATOL, rtol=OTHER_LAYOUT_RTOL)


def test_resume_with_another_effective_batch_is_refused(runs, capsys):
    cfg = runs.schedule_config(1)  # 1 process x accumulation 1: effective batch 1, saved 2
    state = runs.stopped_state(SAVE_EVERY)
    run = in_process(cfg, "--resume", str(state), out=runs.root / "refused")
    assert run.returncode == 2
    err = capsys.readouterr().err
    assert "effective_batch_sizes" in err and "gradient_accumulation_steps" in err
    assert not (runs.root / "refused" / "run.safetensors").exists()


@pytest.mark.parametrize("mode", RESUMED)
def test_a_mid_run_state_resumes_to_the_uninterrupted_weights(runs, mode):
    whole = runs.equivalence(mode, "2x2x1").weights()
    again = runs.get(f"{mode}-resumed").check()
    assert "resumed from" in again.log
    for rank in (0, 1):  # the resumed processes stepped once, from step 1
        assert len(again.rank(rank)["optimizer_lrs"]) == 1
    assert_close_dicts(again.weights(), whole, atol=SAME_LAYOUT_ATOL)
    single = runs.get(f"{mode}-resumed-1x4x1").check()
    assert len(single.rank(0)["optimizer_lrs"]) == 1
    assert_close_dicts(single.weights(), whole, atol=OTHER_LAYOUT_ATOL, rtol=OTHER_LAYOUT_RTOL)
