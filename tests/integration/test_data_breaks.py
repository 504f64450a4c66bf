"""An image that is deleted or damaged while a run trains: the run stops after its last whole
optimizer step with a state that resumes (once the image is back, or gone for good), or, with
skip_bad_images, leaves the image out and trains on; cached latents never read the image again."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
from safetensors import safe_open

from library.sampling.runner import SampleRunner
from library.training.saver import Saver
from tests.integration.harness import assert_close_dicts, make_images, tensors, train, write_config

EPOCHS, IMAGES = 4, 4  # batch 1: 4 optimizer steps per epoch, 16 in all
BROKEN = "img02.png"


@pytest.fixture(scope="module")
def source_images(tmp_path_factory):
    return make_images(tmp_path_factory.mktemp("data") / "imgs", IMAGES)


@pytest.fixture(scope="module")
def straight(tmp_path_factory, tiny_model_dir, source_images):
    """The weights of the run that never breaks (the images' folder does not change them)."""
    root = tmp_path_factory.mktemp("straight")
    assert train(_config(root, tiny_model_dir, source_images, "straight")) == 0
    return tensors(root / "straight" / "run.safetensors")


@pytest.fixture
def images(tmp_path, source_images):
    """A copy of the images this test may damage."""
    return Path(shutil.copytree(source_images, tmp_path / "imgs"))


def _config(tmp_path, model, images, name, **keys):
    keys.setdefault("max_train_epochs", EPOCHS)
    return write_config(tmp_path / f"{name}.toml", model, images, tmp_path / name, **keys)


def _damage(path: Path, how: str) -> None:
    if how == "delete":
        path.unlink()
    else:  # a truncated file: a copy cut short, or a download that stopped
        path.write_bytes(path.read_bytes()[:40])


def _damage_after_step(monkeypatch, step: int, path: Path, how: str) -> None:
    original = Saver.after_step

    def after_step(self, global_step):
        original(self, global_step)
        if global_step == step:
            _damage(path, how)

    monkeypatch.setattr(Saver, "after_step", after_step)


def _damage_at_start(monkeypatch, path: Path) -> None:
    """Damage ``path`` after the data was scanned and checked, before the first step."""
    original = SampleRunner.at_start

    def at_start(self, global_step):
        _damage(path, "truncate")
        original(self, global_step)

    monkeypatch.setattr(SampleRunner, "at_start", at_start)


def _summary(out: Path) -> dict:
    return json.loads((out / "run-summary.json").read_text(encoding="utf-8"))


def _error_line(stderr: str) -> str:
    lines = re.findall(r"(?m)error: (.*)$", re.sub(r"\x1b\[[0-9;]*[A-Za-z]", "", stderr))
    assert len(lines) == 1, stderr[-3000:]
    return lines[0]


def _stopped_state(err: str, out: Path) -> tuple[Path, int]:
    """The state the stop message names and its step, checked against the run summary."""
    line = _error_line(err)
    assert BROKEN in line and "skip_bad_images" in line, line
    match = re.search(r"--resume (\S+)", line)
    assert match, line
    state = Path(match.group(1))
    step = json.loads((state / "progress.json").read_text(encoding="utf-8"))["global_step"]
    summary = _summary(out)
    assert (summary["status"], summary["exit_code"]) == ("failed", 1)
    assert summary["steps_done"] == step and summary["resume_with"] == str(state.absolute())
    assert not (out / "run.safetensors").exists()
    return state, step


@pytest.mark.parametrize("workers", [0, 2])
def test_a_broken_image_stops_with_a_state_that_resumes_once_it_is_back(
    tmp_path, tiny_model_dir, images, straight, monkeypatch, capsys, workers
):
    config = _config(tmp_path, tiny_model_dir, images, "b", max_data_loader_n_workers=workers)
    good = (images / BROKEN).read_bytes()
    _damage_after_step(monkeypatch, 2, images / BROKEN, "truncate")
    assert train(config) == 1
    monkeypatch.undo()
    state, step = _stopped_state(capsys.readouterr().err, tmp_path / "b")
    # workers load ahead, so a worker may still have read the image whole for a step or two
    assert 2 <= step < EPOCHS * IMAGES
    (images / BROKEN).write_bytes(good)
    assert train(config, "--resume", str(state)) == 0
    resumed = tensors(tmp_path / "b" / "run.safetensors")
    assert_close_dicts(resumed, straight, atol=1e-6)


def test_a_deleted_image_stops_and_the_run_resumes_without_it(
    tmp_path, tiny_model_dir, images, monkeypatch, capsys
):
    config = _config(tmp_path, tiny_model_dir, images, "c")
    _damage_after_step(monkeypatch, 2, images / BROKEN, "delete")
    assert train(config) == 1
    monkeypatch.undo()
    state, step = _stopped_state(capsys.readouterr().err, tmp_path / "c")
    assert 2 <= step < EPOCHS * IMAGES
    # three images are left: 3 steps per epoch instead of 4, and the run goes on from its step
    assert train(config, "--resume", str(state)) == 0
    assert "steps_per_epoch: 4 -> 3" in capsys.readouterr().out
    summary = _summary(tmp_path / "c")
    assert (summary["status"], summary["steps_done"], summary["total_steps"]) == (
        "finished", EPOCHS * (IMAGES - 1), EPOCHS * (IMAGES - 1)
    )  # fmt: skip
    with safe_open(str(tmp_path / "c" / "run.safetensors"), framework="pt") as file:
        changes = json.loads(file.metadata()["ss_resume_changes"])
    assert changes == [{"step": step, "changes": {"steps_per_epoch": [IMAGES, IMAGES - 1]}}]


def test_the_first_step_failing_names_the_image_and_saves_nothing(
    tmp_path, tiny_model_dir, images, monkeypatch, capsys
):
    _damage_at_start(monkeypatch, images / BROKEN)
    config = _config(tmp_path, tiny_model_dir, images, "d", train_batch_size=IMAGES)
    assert train(config) == 2  # no step trained: bad input, as before training
    line = _error_line(capsys.readouterr().err)
    assert BROKEN in line and "no optimizer step was trained" in line
    assert not list((tmp_path / "d").glob("*-state"))
    assert _summary(tmp_path / "d")["steps_done"] == 0


def test_skip_bad_images_leaves_a_broken_image_out_and_trains_on(
    tmp_path, tiny_model_dir, images, straight, monkeypatch, capsys
):
    good = (images / BROKEN).read_bytes()
    weights = {}
    for workers in (0, 2):
        name = f"w{workers}"
        (images / BROKEN).write_bytes(good)  # whole while the run scans it
        _damage_at_start(monkeypatch, images / BROKEN)
        config = _config(
            tmp_path, tiny_model_dir, images, name, skip_bad_images=True,
            max_data_loader_n_workers=workers,
        )  # fmt: skip
        assert train(config) == 0
        monkeypatch.undo()
        captured = capsys.readouterr()
        said = [line for line in (captured.out + captured.err).splitlines() if BROKEN in line]
        assert len(said) == 1 and "left out" in said[0], said  # once, not once per sample
        summary = _summary(tmp_path / name)
        assert (summary["status"], summary["steps_done"]) == ("finished", EPOCHS * IMAGES)
        weights[workers] = tensors(tmp_path / name / "run.safetensors")
    # the image's samples weigh nothing, whichever worker met them
    assert_close_dicts(weights[0], weights[2], atol=1e-7)
    assert max((weights[0][k] - straight[k]).abs().max().item() for k in straight) > 1e-4


def test_cached_latents_do_not_read_the_image_again(tmp_path, tiny_model_dir, images, monkeypatch):
    assert train(_config(tmp_path, tiny_model_dir, images, "kept", cache_latents=True)) == 0
    _damage_after_step(monkeypatch, 2, images / BROKEN, "delete")
    assert train(_config(tmp_path, tiny_model_dir, images, "gone", cache_latents=True)) == 0
    gone = tensors(tmp_path / "gone" / "run.safetensors")
    assert_close_dicts(gone, tensors(tmp_path / "kept" / "run.safetensors"), atol=0.0)


def _cache_file_of(cache: Path, image: str) -> Path:
    for file in sorted((cache / "latents").glob("*.safetensors")):
        with safe_open(str(file), framework="pt") as handle:
            if handle.metadata()["source_path"].endswith(image):
                return file
    raise AssertionError(f"no cache file for {image} in {cache}")


def test_a_cache_file_damaged_mid_run_stops_with_a_state_that_resumes(
    tmp_path, tiny_model_dir, images, monkeypatch, capsys
):
    keys = {"cache_latents_to_disk": True, "cache_dir": str(tmp_path / "cache")}
    assert train(_config(tmp_path, tiny_model_dir, images, "straight", **keys)) == 0
    config = _config(tmp_path, tiny_model_dir, images, "e", **keys)
    file = _cache_file_of(tmp_path / "cache", BROKEN)
    _damage_after_step(monkeypatch, 2, file, "truncate")
    assert train(config) == 1
    monkeypatch.undo()
    err = capsys.readouterr().err
    assert str(file) in _error_line(err)
    state, step = _stopped_state(err, tmp_path / "e")
    assert step == 2 or 2 < step < EPOCHS * IMAGES
    assert train(config, "--resume", str(state)) == 0  # the cache build re-encodes the file
    resumed = tensors(tmp_path / "e" / "run.safetensors")
    assert_close_dicts(resumed, tensors(tmp_path / "straight" / "run.safetensors"), atol=1e-6)


def _damage_before_first_validation(monkeypatch) -> list[Path]:
    """Delete the first validation image just before the first validation loss; the list
    receives its path."""
    from library.training.validation_runs import Validator

    original, damaged = Validator.run, []

    def run(self, unreadable):
        if not damaged:
            damaged.append(self.data.scanned[0].validation[0].item.path)
            damaged[0].unlink()
        return original(self, unreadable)

    monkeypatch.setattr(Validator, "run", run)
    return damaged


@pytest.mark.parametrize("skip", [False, True])
def test_a_validation_image_that_breaks_stops_the_run_or_is_left_out(
    tmp_path, tiny_model_dir, images, monkeypatch, capsys, skip
):
    keys = {"validation_split": 0.25, "validate_every_n_steps": 2, "skip_bad_images": skip}
    config = _config(tmp_path, tiny_model_dir, images, "v", **keys)
    damaged = _damage_before_first_validation(monkeypatch)
    code = train(config)
    captured = capsys.readouterr()
    if skip:
        assert code == 0
        said = [line for line in captured.err.splitlines() if str(damaged[0]) in line]
        assert len(said) == 1 and "left out of the validation loss from step 2 on" in said[0]
        return
    assert code == 1
    line = _error_line(captured.err)
    assert str(damaged[0]) in line and "after optimizer step 2 with its state saved" in line
    assert (tmp_path / "v" / "run-step00000002-state").is_dir()
