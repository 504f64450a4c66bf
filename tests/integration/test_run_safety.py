"""Nothing lost, nothing silently wrong: locks, resumes that own their outputs, resume changes,
non-finite weights and leftovers of killed runs, end to end on the tiny model."""

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from library.training.saver import Saver
from tests.integration.harness import make_images, train, write_config

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    return make_images(tmp_path_factory.mktemp("data") / "imgs", 4)


def _config(tmp_path, model, images, name="c", **keys):
    keys.setdefault("max_train_steps", 2)
    return write_config(tmp_path / f"{name}.toml", model, images, tmp_path / name, **keys)


def _metadata(path: Path) -> dict:
    with safe_open(str(path), framework="pt") as file:
        return file.metadata()


def _stop_after(monkeypatch, step: int) -> None:
    original = Saver.after_step

    def stop(self, global_step):
        original(self, global_step)
        if global_step == step:
            raise KeyboardInterrupt

    monkeypatch.setattr(Saver, "after_step", stop)


@pytest.mark.subprocess
def test_a_second_run_on_the_same_output_is_refused(tmp_path, tiny_model_dir, images, capsys):
    config = _config(tmp_path, tiny_model_dir, images)
    hold = (
        "import sys, time\nfrom library.saving.run_lock import RunLock\n"
        f"RunLock({str(tmp_path / 'c')!r}, 'run').acquire()\nprint('held', flush=True)\n"
        "time.sleep(120)\n"
    )
    holder = subprocess.Popen([sys.executable, "-c", hold], cwd=REPO, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        assert train(config) == 2
        error = capsys.readouterr().err
        assert f"pid {holder.pid}" in error and "another run is writing this output name" in error
        assert not (tmp_path / "c" / "run.safetensors").exists()
    finally:
        os.kill(holder.pid, signal.SIGKILL)
        holder.wait()
    assert train(config) == 0  # the killed holder's lock is free again
    assert not (tmp_path / "c" / "run.lock").exists()


def test_resume_refuses_another_runs_file_and_keeps_its_own(tmp_path, tiny_model_dir, images, monkeypatch, capsys):
    other = _config(tmp_path, tiny_model_dir, images, "other", seed=3)
    assert train(other) == 0
    config = _config(tmp_path, tiny_model_dir, images, max_train_steps=4, save_every_n_steps=2, save_state=True)
    _stop_after(monkeypatch, 2)
    assert train(config) == 130
    monkeypatch.undo()
    state = tmp_path / "c" / "run-step00000002-state"
    run_id = json.loads((state / "progress.json").read_text())["run_id"]
    assert _metadata(tmp_path / "c" / "run-step00000002.safetensors")["ss_session_id"] == run_id
    # an unrelated run's file with this output name: the resume would replace it
    foreign = (tmp_path / "other" / "run.safetensors").read_bytes()
    (tmp_path / "c" / "run.safetensors").write_bytes(foreign)
    capsys.readouterr()
    assert train(config, "--resume", str(state)) == 2
    assert "run.safetensors was not written by the run being resumed" in capsys.readouterr().err
    assert (tmp_path / "c" / "run.safetensors").read_bytes() == foreign
    (tmp_path / "c" / "run.safetensors").unlink()
    assert train(config, "--resume", str(state)) == 0  # its own step files are no obstacle
    assert _metadata(tmp_path / "c" / "run.safetensors")["ss_session_id"] == run_id


def _logged_lrs(logdir: Path) -> dict[int, float]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    values = {}
    for events in logdir.rglob("events.out.tfevents.*"):
        acc = EventAccumulator(str(events.parent))
        acc.Reload()
        if "lr/unet" in acc.Tags()["scalars"]:
            values.update({e.step: e.value for e in acc.Scalars("lr/unet")})
    return values


def test_resume_with_a_new_learning_rate_trains_with_it_and_says_so(tmp_path, tiny_model_dir, images, monkeypatch, capsys):
    logs = tmp_path / "logs"
    config = _config(
        tmp_path, tiny_model_dir, images, max_train_steps=4, save_every_n_steps=2, save_state=True,
        log_with="tensorboard", logging_dir=str(logs),
    )
    _stop_after(monkeypatch, 2)
    assert train(config) == 130
    monkeypatch.undo()
    capsys.readouterr()
    state = str(tmp_path / "c" / "run-step00000002-state")
    assert train(config, "--resume", state, "--learning_rate", "5e-4") == 0
    out = capsys.readouterr().out
    assert "learning_rate: 0.001 -> 0.0005 (applied)" in out
    assert _logged_lrs(logs) == pytest.approx({1: 1e-3, 2: 1e-3, 3: 5e-4, 4: 5e-4})
    metadata = _metadata(tmp_path / "c" / "run.safetensors")
    assert metadata["ss_learning_rate"] == "0.0005"
    assert json.loads(metadata["ss_resume_changes"]) == [
        {"step": 2, "changes": {"learning_rate": [0.001, 0.0005]}}
    ]


def test_resume_refusals_are_one_line_before_models_load(tmp_path, tiny_model_dir, images, monkeypatch, capsys):
    config = _config(tmp_path, tiny_model_dir, images, save_state_on_train_end=True)
    assert train(config) == 0
    state = tmp_path / "c" / "run-state"
    monkeypatch.setattr("library.training.trainer.load_components", lambda *a, **k: pytest.fail("loaded"))
    cases = [
        (["--network_dim", "8", "--max_train_steps", "4"], "network_dim was 4 in"),
        (["--optimizer_type", "Lion", "--max_train_steps", "4"], "optimizer_type was"),
        (["--clip_skip", "2", "--max_train_steps", "4"], "clip_skip was"),  # text adapters train
        ([], "is at optimizer step 2, and this run ends at step 2"),
    ]
    for extra, expected in cases:
        capsys.readouterr()
        assert train(config, "--resume", str(state), *extra) == 2, extra
        lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error")]
        assert len(lines) == 1 and expected in lines[0], lines
    progress = json.loads((state / "progress.json").read_text())
    (state / "progress.json").write_text(json.dumps({**progress, "global_step": "x"}))
    assert train(config, "--resume", str(state), "--max_train_steps", "4") == 2
    assert "has no valid global_step" in capsys.readouterr().err


def test_non_finite_weights_are_never_saved_as_a_good_state(tmp_path, tiny_model_dir, images, monkeypatch, capsys):
    step = torch.optim.AdamW.step

    def broken_step(self, *args, **kwargs):
        # a numerically broken update: every step leaves an infinite weight behind
        result = step(self, *args, **kwargs)
        with torch.no_grad():
            self.param_groups[0]["params"][0].fill_(float("inf"))
        return result

    monkeypatch.setattr(torch.optim.AdamW, "step", broken_step)
    config = _config(tmp_path, tiny_model_dir, images, max_train_steps=4, save_every_n_steps=1, save_state=True)
    assert train(config) == 1
    error = capsys.readouterr().err
    assert "the trained weights are not finite at optimizer step 1" in error
    assert "no earlier state was saved" in error
    assert not list((tmp_path / "c").glob("*-state")) and not list((tmp_path / "c").glob("*.safetensors"))


def test_leftovers_of_a_killed_save_are_cleaned_at_start(tmp_path, tiny_model_dir, images):
    out = tmp_path / "c"
    out.mkdir()
    leftover = out / ".run.safetensors.k1ll3d.tmp"
    leftover.write_bytes(b"half a file")
    unrelated = out / ".notes.txt.tmp"
    unrelated.write_text("not ours")
    assert train(_config(tmp_path, tiny_model_dir, images)) == 0
    assert not leftover.exists() and unrelated.exists()


def test_unusable_output_dir_stops_before_models_load(tmp_path, tiny_model_dir, images, monkeypatch, capsys):
    monkeypatch.setattr("library.training.trainer.load_components", lambda *a, **k: pytest.fail("loaded"))
    a_file = tmp_path / "taken"
    a_file.write_text("x")
    config = _config(tmp_path, tiny_model_dir, images)
    # a file where the folder should be, and a place no one may write (/sys refuses even root)
    for place, expected in ((a_file, "is a file, not a folder"), (Path("/sys/difftune-out"), "is not writable")):
        capsys.readouterr()
        assert train(config, "--output_dir", str(place)) == 2
        lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
        assert len(lines) == 1 and f"output_dir {place} {expected}" in lines[0], lines


@pytest.mark.parametrize(
    ("key", "value"), [("learning_rate", "inf"), ("unet_lr", "nan"), ("noise_offset", "inf"), ("learning_rate", "1e39")]
)
def test_non_finite_or_unusable_numbers_are_refused_at_load(tmp_path, tiny_model_dir, images, capsys, key, value):
    config = _config(tmp_path, tiny_model_dir, images)
    assert train(config, f"--{key}", value) == 2
    error = capsys.readouterr().err
    assert f'key "{key}"' in error and ("finite" in error or "<= 3e+38" in error), error


def test_resume_with_frozen_text_encoders_applies_a_new_clip_skip(tmp_path, tiny_model_dir, images, capsys):
    """Without text-encoder adapters, clip_skip only changes the conditioning (like editing the
    captions): a resume applies it and says so instead of refusing."""
    config = _config(
        tmp_path, tiny_model_dir, images, save_every_n_steps=1, save_state=True,
        network_train_unet_only=True,
    )
    assert train(config) == 0
    capsys.readouterr()
    state = str(tmp_path / "c" / "run-step00000001-state")
    assert train(config, "--resume", state, "--clip_skip", "2") == 0
    assert "clip_skip: null -> 2 (applied)" in capsys.readouterr().out
