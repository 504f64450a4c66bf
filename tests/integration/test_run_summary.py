"""The run summary (<output_name>-summary.json): what a batch script reads after a run that
finished, failed or was stopped; never written by refused or dry runs; replaced atomically."""

from __future__ import annotations

import errno
import json
import os
import re
import signal
import time
from datetime import datetime
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from safetensors.torch import save_file

from library.config.schema import SavingSection
from library.errors import TrainingError
from library.saving.outputs import OutputLayout
from library.training import run_summary
from library.training.run_summary import RunSummary
from tests.integration.harness import make_images, train, write_config


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    return make_images(tmp_path_factory.mktemp("data") / "imgs", 3)


def _summary(out: Path, name: str = "run") -> dict:
    return json.loads((out / f"{name}-summary.json").read_text(encoding="utf-8"))


def _outcome(summary: dict) -> tuple:
    return summary["status"], summary["exit_code"], summary["exit_reason"]


def _error_line(stderr: str) -> str:
    """The text of the CLI's one "error: ..." line (it may follow the progress bar's last frame)."""
    plain = re.sub(r"\x1b\[[0-9;]*[A-Za-z]", "", stderr)
    lines = re.findall(r"(?m)(?:^|(?<=\]))error: (.*)$", plain)
    assert len(lines) == 1, stderr[-3000:]
    return lines[0]


def _on_disk(out: Path) -> set[str]:
    """Every output of the name "run" in ``out``, as absolute paths."""
    skip = {"run-summary.json", "run.lock"}
    return {
        str(p.absolute()) for p in out.iterdir() if p.name.startswith("run") and p.name not in skip
    }


def _hook_micro_batches(monkeypatch, hook) -> None:
    """Call ``hook(n)`` before the trainer's n-th micro-batch loss (1-based); a float it returns
    multiplies that loss (NaN poisons it)."""
    from library.training import trainer

    real, calls = trainer.micro_batch_loss, [0]

    def hooked(inputs, batch):
        calls[0] += 1
        factor = hook(calls[0])
        loss = real(inputs, batch)
        return loss * factor if factor is not None else loss

    monkeypatch.setattr(trainer, "micro_batch_loss", hooked)


def test_a_finished_run_describes_itself_and_refused_or_dry_runs_leave_it(
    tmp_path, tiny_model_dir, images, capsys
):
    from tests.distributed.runs import scalars

    out, logs = tmp_path / "out", tmp_path / "logs"
    config = write_config(
        tmp_path / "c.toml", tiny_model_dir, images, out,
        max_train_steps=3, save_every_n_steps=2, save_state=True, log_with="tensorboard", logging_dir=str(logs),
    )  # fmt: skip
    # an earlier run's file of this name, which --overwrite moves aside: not this run's output
    out.mkdir()
    foreign = out / "run-000005.safetensors"
    save_file({"x": torch.zeros(1)}, str(foreign), metadata={"ss_session_id": "1"})
    before = time.time()
    assert train(config, "--overwrite") == 0
    after = time.time()
    (aside,) = out.glob("run-replaced-*")
    assert [p.name for p in aside.iterdir()] == [foreign.name] and not foreign.exists()
    summary = _summary(out)
    from library import __version__

    assert summary["summary_version"] == 1 and summary["difftune_version"] == __version__
    assert _outcome(summary) == ("finished", 0, None)
    started = datetime.fromisoformat(summary["started_at"]).timestamp()
    finished = datetime.fromisoformat(summary["finished_at"]).timestamp()
    assert before - 1 <= started <= finished <= after + 1
    assert 0 <= summary["seconds"] <= after - before + 1
    assert summary["pid"] == os.getpid()
    assert summary["config_files"] == [str(config.absolute())]
    assert summary["output_dir"] == str(out.absolute()) and summary["output_name"] == "run"
    assert summary["world_size"] == 1
    assert (summary["steps_done"], summary["total_steps"], summary["steps_this_run"]) == (3, 3, 3)
    assert (summary["epoch"], summary["epochs"]) == (1, 1)
    assert summary["resumed_from"] is None and summary["samples"] is None
    progress = json.loads((out / "run-state" / "progress.json").read_text())
    assert summary["run_id"] == progress["run_id"]

    # every output is listed, with what it is, and nothing else
    listed = {o["path"]: o for o in summary["outputs"]}
    assert set(listed) == _on_disk(out) - {str(aside.absolute())} and len(listed) == 4
    assert listed[str((out / "run.safetensors").absolute())] == {
        "path": str((out / "run.safetensors").absolute()), "kind": "weights", "final": True,
    }  # fmt: skip
    assert listed[str((out / "run-step00000002-state").absolute())]["step"] == 2
    assert listed[str((out / "run-state").absolute())]["step"] == 3
    assert listed[str((out / "run-step00000002.safetensors").absolute())]["kind"] == "weights"
    assert summary["resume_with"] == str((out / "run-state").absolute())

    # the losses are the logged ones
    assert summary["last_loss_step"] == 3
    assert summary["last_loss"] == pytest.approx(scalars(logs, "loss/step")[-1][1], rel=1e-6)
    assert summary["last_epoch_loss"] == pytest.approx(scalars(logs, "loss/epoch")[-1][1], rel=1e-6)
    assert not list(out.glob(".run-summary.json.*"))

    # a run refused before training, and a dry run, leave the summary as it was
    written = (out / "run-summary.json").read_bytes()
    capsys.readouterr()
    assert train(config) == 2
    assert "already exists" in _error_line(capsys.readouterr().err)
    assert train(config, "--dry_run", "--overwrite", "--json") == 0
    assert (out / "run-summary.json").read_bytes() == written

    # the memory the plan estimated (on the loaded models; the dry run's on shapes alone) and
    # what the process used: on the CPU no allocator peaks, the host's resident set
    plan = json.loads(capsys.readouterr().out)
    memory = summary["memory"]
    assert memory["estimated_peak_bytes"] == plan["memory"]["peak_bytes"] > 0
    assert memory["peak_allocated_bytes"] is None and memory["peak_reserved_bytes"] is None
    assert memory["peak_resident_bytes"] >= 100 * 2**20  # torch itself takes more


def test_a_non_finite_loss_is_a_failed_run_with_code_1_and_the_state_to_resume(
    tmp_path, tiny_model_dir, images, monkeypatch, capsys
):
    # the running summary is rewritten after every step
    monkeypatch.setattr(run_summary, "REFRESH_SECONDS", 0.0)
    out = tmp_path / "out"
    seen = {}

    def hook(n):
        seen[n] = _summary(out)  # what a queue sees while the run trains
        return float("nan") if n == 2 else None

    _hook_micro_batches(monkeypatch, hook)
    config = write_config(tmp_path / "c.toml", tiny_model_dir, images, out, max_train_steps=3)
    assert train(config) == 1
    reason = _error_line(capsys.readouterr().err)
    assert reason.startswith("the loss became nan at optimizer step 2")

    running = seen[1]
    assert _outcome(running) == ("running", None, None) and running["finished_at"] is None
    assert running["pid"] == os.getpid() and running["steps_done"] == 0 and running["outputs"] == []
    assert seen[2]["status"] == "running" and seen[2]["steps_done"] == 1  # refreshed after step 1

    summary = _summary(out)
    assert _outcome(summary) == ("failed", 1, reason)
    assert summary["steps_done"] == 1 and summary["total_steps"] == 3
    assert summary["last_loss_step"] == 1 and summary["last_loss"] == seen[2]["last_loss"]
    assert summary["last_loss"] is not None and summary["last_epoch_loss"] is None
    state = str((out / "run-step00000001-state").absolute())
    assert summary["resume_with"] == state and state in reason
    assert [o["path"] for o in summary["outputs"]] == [state]


def test_a_stopped_run_says_so_and_its_resume_replaces_the_summary(
    tmp_path, tiny_model_dir, images, monkeypatch, capsys
):
    out = tmp_path / "out"

    def ctrl_c(n):  # Ctrl-C while step 1 trains: the run stops after it, with a state
        if n == 1:
            os.kill(os.getpid(), signal.SIGINT)

    _hook_micro_batches(monkeypatch, ctrl_c)
    config = write_config(tmp_path / "c.toml", tiny_model_dir, images, out, max_train_steps=3)
    assert train(config) == 130
    reason = _error_line(capsys.readouterr().err)
    state = out / "run-step00000001-state"
    assert reason == f"stopped by SIGINT after optimizer step 1; continue with --resume {state}"
    stopped = _summary(out)
    assert _outcome(stopped) == ("stopped", 130, reason)
    assert stopped["steps_done"] == 1 and stopped["resume_with"] == str(state.absolute())
    assert stopped["outputs"] == [{"path": str(state.absolute()), "kind": "state", "step": 1}]
    monkeypatch.undo()

    # the summary does not stop the resume; the resume replaces it
    assert train(config, "--resume", stopped["resume_with"]) == 0
    resumed = _summary(out)
    assert (resumed["status"], resumed["exit_code"]) == ("finished", 0)
    assert resumed["resumed_from"] == {"state": str(state.absolute()), "step": 1}
    assert (resumed["steps_done"], resumed["steps_this_run"]) == (3, 2)
    assert resumed["run_id"] == stopped["run_id"]
    assert {o["path"] for o in resumed["outputs"]} == _on_disk(out)
    assert resumed["started_at"] >= stopped["finished_at"]


def _fake_summary(out: Path, main: bool = True, prompts: str | None = None) -> RunSummary:
    config = SimpleNamespace(
        saving=SavingSection(output_dir=str(out), output_name="run"),
        data=SimpleNamespace(dataset_config=None),
        sampling=SimpleNamespace(sample_prompts=prompts),
    )
    plan = SimpleNamespace(
        steps_per_epoch=2, total_steps=4, epochs=2, world_size=1, epoch_of_step=lambda s: s // 2
    )
    start = SimpleNamespace(run_id="42", resume=None)
    accelerator = SimpleNamespace(is_main_process=main, device=torch.device("cpu"))
    return RunSummary(config, plan, accelerator, start, ["a.toml"])


def test_a_failed_write_leaves_the_previous_summary_whole(tmp_path, monkeypatch, capsys):
    out = tmp_path / "out"
    summary = _fake_summary(out)
    summary.step(1, 0.5, True)
    summary.write("finished")
    previous = (out / "run-summary.json").read_bytes()
    assert json.loads(previous)["steps_done"] == 1

    real = Path.write_text

    def half_then_full_disk(self, text, *args, **kwargs):  # the disk fills up mid-write
        real(self, text[: len(text) // 2], *args, **kwargs)
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(Path, "write_text", half_then_full_disk)
    summary.step(2, 0.25, True)
    summary.write("failed", TrainingError("the loss became nan"))  # a warning, not an error
    summary.write("failed", TrainingError("the loss became nan"))
    monkeypatch.undo()
    assert (out / "run-summary.json").read_bytes() == previous
    assert sorted(p.name for p in out.iterdir()) == ["run-summary.json"]  # no temporary left
    warnings = [line for line in capsys.readouterr().err.splitlines() if line.startswith("warning")]
    assert warnings == [
        f"warning: the run summary {out / 'run-summary.json'} was not written (cannot write "
        f"{out / 'run-summary.json'}: no space left on device; free space or choose another output_dir)"
    ]


def test_only_the_main_process_writes_and_the_summary_is_no_output(tmp_path):
    out = tmp_path / "out"
    _fake_summary(out, main=False).write("finished")
    assert not out.exists()

    _fake_summary(out).write("running")
    layout = OutputLayout(SavingSection(output_dir=str(out), output_name="run"))
    assert layout.existing_outputs() == []  # never refused, resumed over or pruned as an output
    layout.refuse_overwrite(resuming=False)
    layout.refuse_overwrite(resuming=True, run_id="7")
    leftover = out / ".run-summary.json.x1y2.tmp"  # of a run killed while writing it
    other = out / ".runner-summary.json.x1y2.tmp"
    leftover.write_text("{")
    other.write_text("{")
    assert layout.remove_leftovers() == [leftover] and other.exists()


def test_the_sample_images_of_this_output_name_are_counted(tmp_path):
    out = tmp_path / "out"
    folder = out / "sample"
    folder.mkdir(parents=True)
    for name in ("run_000001_00_7.png", "run_000001_grid.png", "runner_000001_00_7.png", "run.txt"):
        (folder / name).write_bytes(b"")
    assert _fake_summary(out, prompts="p.txt").fields("running")["samples"] == {
        "folder": str(folder.absolute()),
        "images": 2,
    }


LAUNCHER = """
import os, signal, sys
from pathlib import Path

sys.path.insert(0, {repo!r})
from library.cli import exit_process, main
from library.training import trainer

real, calls = trainer.micro_batch_loss, [0]


def loss(inputs, batch):  # Ctrl-C on rank 1 alone, while step 1 trains
    calls[0] += 1
    if calls[0] == 1 and os.environ["RANK"] == "1":
        os.kill(os.getpid(), signal.SIGINT)
    return real(inputs, batch)


trainer.micro_batch_loss = loss
code = main(sys.argv[1:])
Path({out!r}, "rank" + os.environ["RANK"] + ".exit").write_text(str(code))
exit_process(code)
"""


def test_two_processes_agree_and_only_the_main_one_writes(tmp_path, tiny_model_dir, images):
    from tests.distributed.runs import REPO, torchrun

    out = tmp_path / "out"
    out.mkdir()
    script = tmp_path / "launch.py"
    script.write_text(LAUNCHER.format(repo=str(REPO), out=str(out)), encoding="utf-8")
    config = write_config(tmp_path / "c.toml", tiny_model_dir, images, out, max_train_steps=4)
    run = torchrun(config, out=out, script=script)
    assert run.returncode != 0
    exits = {
        rank: (out / f"rank{rank}.exit").read_text()
        for rank in (0, 1)
        if (out / f"rank{rank}.exit").exists()
    }
    assert exits == {0: "130", 1: "130"}, run.log[-3000:]
    summary = _summary(out)
    state = out / "run-step00000001-state"
    reason = f"stopped by SIGINT after optimizer step 1; continue with --resume {state}"
    assert _outcome(summary) == ("stopped", 130, reason) and summary["world_size"] == 2
    assert summary["resume_with"] == str(state.absolute()) and summary["steps_done"] == 1
    assert sorted(p.name for p in out.glob("*summary*")) == ["run-summary.json"]


def test_every_kind_of_output_is_described_by_its_name(tmp_path):
    layout = OutputLayout(SavingSection(output_dir=str(tmp_path), output_name="run"))
    state = tmp_path / "run-000002-state"
    state.mkdir()
    (state / "progress.json").write_text('{"global_step": 8}')
    expected = {
        "run.safetensors": {"kind": "weights", "final": True},
        "run-ema.safetensors": {"kind": "ema weights", "final": True},
        "run": {"kind": "diffusers folder", "final": True},
        "run-step00000500.safetensors": {"kind": "weights", "step": 500},
        "run-step00000500-ema.safetensors": {"kind": "ema weights", "step": 500},
        "run-000002.safetensors": {"kind": "weights", "epoch": 2},
        "run-000002-state": {"kind": "state", "epoch": 2, "step": 8},  # from its progress.json
        "run-step00000001-state": {"kind": "state", "step": None},  # no readable progress.json
    }
    for name, fields in expected.items():
        assert layout.describe(tmp_path / name) == {"path": str(tmp_path / name), **fields}, name
