"""examples/queue.sh on the CPU: GPU sets in parallel, jobs one after another, a failed job, a
refused one, Ctrl-C on the queue, and a second queue run that resumes the stopped job.

The trainings run as ``python launch.py`` (LAUNCH=python, TRAIN=launch.py): train_network.py with
two test hooks chosen by output name, a NaN loss and a gate that holds a run in its first step
until the test opens it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.integration.harness import make_images, write_config

REPO = Path(__file__).resolve().parents[2]
QUEUE = REPO / "examples" / "queue.sh"

LAUNCHER = """
import os, sys, time
from pathlib import Path

sys.path.insert(0, {repo!r})
from library.cli import exit_process, main
from library.training import trainer

name = sys.argv[sys.argv.index("--output_name") + 1]
real, calls = trainer.micro_batch_loss, [0]


def loss(inputs, batch):
    calls[0] += 1
    gate = os.environ.get("QUEUE_TEST_GATE")
    if name == "slow" and gate and calls[0] == 1:
        while not Path(gate).exists():  # held in step 1 until the test has stopped the queue
            time.sleep(0.05)
    value = real(inputs, batch)
    return value * float("nan") if name == "nan" and calls[0] == 2 else value


trainer.micro_batch_loss = loss
exit_process(main(sys.argv[1:]))
"""


def _summary(out: Path, name: str) -> dict:
    return json.loads((out / f"{name}-summary.json").read_text(encoding="utf-8"))


def _wait_for(what, check, proc: subprocess.Popen, log: Path, timeout: float = 240) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert proc.poll() is None, f"the queue ended before {what}:\n{log.read_text()}"
        assert time.monotonic() < deadline, f"no {what} after {timeout} s:\n{log.read_text()}"
        time.sleep(0.1)


def _status(out: Path, name: str) -> str | None:
    try:
        return _summary(out, name)["status"]
    except (OSError, ValueError):
        return None


def _default_sigint() -> None:
    # A shell started from a non-interactive shell's background job (`nohup ... &`, as CI may
    # be) inherits SIGINT ignored, and bash cannot trap a signal ignored on entry: the queue
    # would never hear the test's Ctrl-C. A terminal's queue has it at its default.
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _queue(jobs: Path, env: dict, log: Path) -> subprocess.Popen:
    with log.open("w") as console:
        return subprocess.Popen(
            ["bash", str(QUEUE), str(jobs)],
            env=env,
            cwd=jobs.parent,
            stdout=console,
            stderr=subprocess.STDOUT,
            preexec_fn=_default_sigint,
        )


@pytest.mark.subprocess
@pytest.mark.skipif(os.name != "posix", reason="a bash script")
def test_the_queue_runs_sets_in_parallel_handles_failures_and_resumes_what_was_stopped(
    tmp_path, tiny_model_dir
):
    images = make_images(tmp_path / "imgs", 2)
    out = tmp_path / "out"
    base = write_config(
        tmp_path / "base.toml", tiny_model_dir, images, tmp_path / "unused", max_train_steps=3
    )
    (tmp_path / "bad.toml").write_text("learning_rat = 1e-4\n", encoding="utf-8")
    launcher = tmp_path / "launch.py"
    launcher.write_text(LAUNCHER.format(repo=str(REPO)), encoding="utf-8")
    jobs = tmp_path / "jobs.txt"
    jobs.write_text(
        "# GPUS CONFIG OUTPUT_DIR OUTPUT_NAME [arguments]\n"
        f"0    {base}  {out}  nan\n"
        f"0    {tmp_path / 'bad.toml'}  {out}  bad  --seed 3\n"
        f"1,2  {base}  {out}  slow\n",
        encoding="utf-8",
    )
    gate = tmp_path / "gate"
    env = {
        **os.environ, "LAUNCH": "python", "TRAIN": str(launcher), "POLL": "0.2",
        "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "QUEUE_TEST_GATE": str(gate),
    }  # fmt: skip
    log = tmp_path / "queue1.log"
    proc = _queue(jobs, env, log)
    try:
        # set "0" runs nan, then bad, while set "1,2" holds slow in its first step
        _wait_for("bad done", lambda: "bad: refused" in log.read_text(), proc, log)
        _wait_for("slow running", lambda: _status(out, "slow") == "running", proc, log)
        proc.send_signal(signal.SIGINT)  # Ctrl-C on the queue
        _wait_for("the stop sent", lambda: "slow: stop sent to pid" in log.read_text(), proc, log)
        gate.touch()
        assert proc.wait(timeout=240) == 130, log.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
    text = log.read_text()
    assert "nan: started on GPUs 0 " in text and "slow: started on GPUs 1,2 " in text
    nan, slow = _summary(out, "nan"), _summary(out, "slow")
    assert (nan["status"], nan["exit_code"]) == ("failed", 1)
    assert f"nan: failed (exit code 1): {nan['exit_reason']}" in text
    # a failure (exit code 1) does not stop the set by default: bad starts after nan, and is
    # refused before it takes its output name (a config error): no summary of its own
    assert text.index("bad: started on GPUs 0 ") > text.index("nan: failed")
    assert "bad: refused (exit code 2)" in text and not (out / "bad-summary.json").exists()
    assert "error: config error" in (out / "bad.log").read_text()
    assert (slow["status"], slow["exit_code"], slow["steps_done"]) == ("stopped", 130, 1)
    assert slow["resume_with"] == str(out / "slow-step00000001-state")
    # beside set "0", not after it: the queue starts set "1,2" before nan's run can end. (The
    # summaries' second-resolution clocks can't show it: on a loaded machine slow's trainer may
    # write its start after nan's failure, though both processes started together.)
    assert text.index("slow: started on GPUs 1,2 ") < text.index("nan: failed")

    # the queue again: the failed job is skipped, the stopped one resumes and finishes
    del env["QUEUE_TEST_GATE"]
    log = tmp_path / "queue2.log"
    assert _queue(jobs, env, log).wait(timeout=240) == 1, log.read_text()  # nan is still failed
    text = log.read_text()
    assert "nan: failed before (exit code 1), skipped" in text
    assert f"slow: started on GPUs 1,2, resuming {slow['resume_with']}" in text
    assert "slow: finished (exit code 0)" in text
    resumed = _summary(out, "slow")
    assert resumed["status"] == "finished" and resumed["resumed_from"]["step"] == 1
    assert resumed["steps_done"] == 3 and (out / "slow.safetensors").is_file()
    assert (out / "nan-summary.json").read_text() == json.dumps(nan, indent=2) + "\n"

    # and again: nothing left to train
    log = tmp_path / "queue3.log"
    assert _queue(jobs, env, log).wait(timeout=240) == 1, log.read_text()
    text = log.read_text()
    assert "slow: finished before, skipped" in text and "slow: started" not in text
