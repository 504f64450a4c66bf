"""The training benchmark's step timer and figures (bench/train_speed.py): the hook sees every
optimizer step of a child process and nothing else, and s/step, images/s and first-step time
are what the recorded times say."""

from __future__ import annotations

import os
import statistics
import subprocess
import sys

import pytest

from bench.train_speed import TIMER_DIR, BenchError, Run, case_text, read_step_timer

CHILD = """
import time, torch
model = torch.nn.Linear(2, 1)
adam = torch.optim.AdamW(model.parameters())
sgd = torch.optim.SGD(model.parameters(), lr=0.1)
for optimizer in (adam, adam, sgd):
    model(torch.ones(1, 2)).sum().backward()
    optimizer.step()
    optimizer.zero_grad()
    time.sleep(0.05)
"""


def _run_child(code: str, timer_dir, **extra_env) -> list[list[dict]]:
    env = {**os.environ, "DIFFTUNE_STEP_TIMER": str(timer_dir), **extra_env}
    env["PYTHONPATH"] = os.pathsep.join([str(TIMER_DIR), env.get("PYTHONPATH", "")])
    subprocess.run([sys.executable, "-c", code], env=env, check=True, timeout=120)
    return read_step_timer(timer_dir)


@pytest.mark.subprocess
@pytest.mark.parametrize("ending", ["", "import os; os._exit(0)"])
def test_step_timer_records_every_optimizer_step_of_any_optimizer(tmp_path, ending):
    # multi-process difftune runs end with os._exit: the records must already be on disk
    processes = _run_child(CHILD + ending, tmp_path)
    assert len(processes) == 1
    steps = processes[0]
    assert len(steps) == 3  # two AdamW steps and one SGD step, through the same global hook
    times = [s["time"] for s in steps]
    gaps = [b - a for a, b in zip(times, times[1:], strict=False)]
    assert all(g >= 0.04 for g in gaps), gaps  # the child sleeps 0.05 s after each step
    assert steps[-1]["peak_rss_bytes"] > 10 * 2**20  # torch alone takes more than 10 MiB
    assert steps[-1]["cuda_max_allocated_bytes"] is None


MIB = 2**20
MEMORY_CHILD = """
import torch
params = [torch.nn.Parameter(torch.zeros(1024, 1024)) for _ in range(4)]  # 16 MiB
sgd = torch.optim.SGD(params, lr=0.1)
for step in range(4):
    for p in params:
        p.grad = torch.ones_like(p)  # 16 MiB of gradients
    if step == 2:
        spike = torch.ones(64, 1024, 1024)  # 256 MiB, alive for a moment in the third step
        del spike
    sgd.step()
"""


@pytest.mark.subprocess
def test_step_memory_is_the_peak_of_tensors_alive_in_each_step(tmp_path):
    steps = _run_child(MEMORY_CHILD, tmp_path, DIFFTUNE_STEP_MEMORY="1",
                       MALLOC_MMAP_THRESHOLD_=str(64 * 1024))[0]  # fmt: skip
    assert "step_peak_bytes" not in steps[0]  # no reset before the first step
    peaks = [s["step_peak_bytes"] / MIB for s in steps[1:]]
    # params and gradients: 32 MiB at every reset; each new gradient (4 MiB) is made while
    # the one it replaces is held; the spike comes on top of the 32 MiB in the second one
    assert peaks[0] == pytest.approx(36, abs=1) and peaks[2] == pytest.approx(36, abs=1)
    assert peaks[1] == pytest.approx(32 + 256, abs=1)
    # the resident set's own step peaks: the interpreter, and the spike on top in the second
    rss = [s["step_peak_rss_bytes"] / MIB for s in steps[1:]]
    assert rss[1] > max(rss[0], rss[2]) + 250 and rss[0] > peaks[0]
    faults = [s["minor_faults"] for s in steps]
    assert faults == sorted(faults) and steps[-1]["cpu_seconds"] >= steps[0]["cpu_seconds"] > 0
    # the run's peak resident set is kept across the resets
    assert steps[-1]["peak_rss_bytes"] >= steps[2]["peak_rss_bytes"] > 256 * MIB


@pytest.mark.subprocess
def test_processes_without_an_optimizer_step_write_nothing(tmp_path):
    assert _run_child("import torch; torch.ones(3).sum()", tmp_path) == []


@pytest.mark.subprocess
def test_step_timer_is_inert_without_its_variable(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "DIFFTUNE_STEP_TIMER"}
    env["PYTHONPATH"] = str(TIMER_DIR)
    code = "import sys; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], env=env, check=True, capture_output=True,
                         text=True, timeout=60)  # fmt: skip
    assert out.stdout.strip() == "False"  # not even torch is imported


def test_figures_from_step_times():
    times = [10.0, 11.0, 11.5, 12.1, 12.5, 13.2]
    run = Run(times, started=4.0, peak_rss_bytes=1, cuda_max_allocated_bytes=None,
              samples_per_step=4)  # fmt: skip
    figures = run.figures(warmup=2)
    timed = [0.5, 0.6, 0.4, 0.7]  # the third to sixth steps: the first two are warm-up
    assert figures["steps_timed"] == 4
    assert figures["seconds_per_step"] == pytest.approx(statistics.median(timed))
    assert figures["mean_seconds_per_step"] == pytest.approx(statistics.fmean(timed), abs=1e-4)
    assert figures["images_per_second"] == pytest.approx(4 / statistics.median(timed), abs=1e-3)
    assert figures["first_step_seconds"] == pytest.approx(6.0)
    with pytest.raises(BenchError, match="raise --steps"):
        Run(times[:2], 4.0, 1, None, 4).figures(warmup=2)


def test_case_files_are_toml_both_trainers_read():
    import tomllib

    keys = {"a": True, "b": 1e-4, "c": 8, "d": 'C:\\path "x"'}
    text = case_text(keys)
    assert tomllib.loads(text) == keys


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--processes", "0"], "argument --processes: 0 is less than 1"),
        (["--processes", "1", "two"], "argument --processes: 'two' is not a whole number"),
        (["--steps", "0"], "argument --steps: 0 is less than 1"),
        (["--repeats", "0"], "argument --repeats: 0 is less than 1"),
        (["--warmup", "-1"], "argument --warmup: -1 is less than 0"),
        (["--steps", "2"], "--steps 2 leaves no step to time after --warmup 2; use --steps 3"),
        (["--steps", "1", "--warmup", "0"], "use --steps 2 or more"),
        (["--config", "missing.toml"], "--config missing.toml: no such file"),
        (["--cases", "tiny-sd1-lora", "nope"], "--cases: unknown case 'nope'"),
    ],
)
def test_arguments_are_checked_before_any_case_runs(monkeypatch, capsys, argv, message):
    import bench.train_speed as train_speed

    def ran(*_):
        raise AssertionError("a case ran before the arguments were checked")

    monkeypatch.setattr(train_speed, "bench", ran)
    monkeypatch.chdir(os.path.dirname(__file__))
    with pytest.raises(SystemExit) as exited:
        train_speed.main([*argv, "--device", "cpu"])
    assert exited.value.code == 2
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert ": error: " in error and message in error  # argparse's one line


def test_steps_from_the_users_config_are_not_checked_against_the_warmup(monkeypatch, tmp_path):
    import bench.train_speed as train_speed

    config = tmp_path / "run.toml"
    config.write_text("", "utf-8")
    monkeypatch.setattr(train_speed, "bench", lambda args: [])
    assert train_speed.main(["--config", str(config), "--device", "cpu"]) == 0
