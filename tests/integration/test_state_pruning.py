"""save_last_n_steps_state / save_last_n_epochs_state on the saves of real tiny runs: weights and
states each kept by their own window, as sd-scripts keeps them, and the state a resume started
from never deleted before a newer state exists."""

from __future__ import annotations

import json
import re

import pytest

from library.training.saver import Saver
from tests.integration.harness import make_images, train, write_config
from tests.saving.sd_scripts_pruning import sd_scripts_epochs, sd_scripts_steps


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    return make_images(tmp_path_factory.mktemp("data") / "imgs", 4)


def _left(folder, numbered: str) -> tuple[set[int], set[int]]:
    """(numbers of the weights files left, numbers of the state folders left)."""
    weights, states = set(), set()
    for path in folder.iterdir():
        found = re.fullmatch(numbered + r"(\.safetensors|-state)", path.name)
        if found:
            (weights if found.group(2) == ".safetensors" else states).add(int(found.group(1)))
    return weights, states


def test_weights_and_states_keep_their_own_windows(tmp_path, tiny_model_dir, images, capsys):
    # 4 images, batch 2: 2 optimizer steps per epoch, 10 steps = 5 epochs
    windows = dict(
        save_every_n_steps=3, save_last_n_steps=6, save_last_n_steps_state=3,
        save_every_n_epochs=1, save_last_n_epochs=3, save_last_n_epochs_state=1,
    )  # fmt: skip
    out = tmp_path / "out"
    config = write_config(
        tmp_path / "c.toml", tiny_model_dir, images, out, train_batch_size=2,
        max_train_steps=10, save_state=True, **windows,
    )  # fmt: skip
    assert train(config) == 0
    plan = capsys.readouterr().out
    assert "keeping those of the last 6 steps; states: those of the last 3 steps" in plan
    assert "keeping the last 3; states: the last 1" in plan
    assert _left(out, r"run-step(\d{8})") == sd_scripts_steps(3, 6, 3, [3, 6, 9])
    assert _left(out, r"run-(\d{6})") == sd_scripts_epochs(1, 3, 1, [1, 2, 3, 4])
    assert (out / "run-state").is_dir() and (out / "run.safetensors").is_file()


def _stop_after(monkeypatch, stop_step: int) -> None:
    original = Saver.after_step

    def stop(self, global_step):
        original(self, global_step)
        if global_step == stop_step:
            raise KeyboardInterrupt  # stopped right after that step's save

    monkeypatch.setattr(Saver, "after_step", stop)


@pytest.mark.parametrize("save_state", [False, True])
def test_the_state_a_resume_started_from_outlives_pruning(
    tmp_path, tiny_model_dir, images, monkeypatch, save_state
):
    out = tmp_path / "out"
    config = write_config(
        tmp_path / "c.toml", tiny_model_dir, images, out, train_batch_size=1,
        max_train_steps=8, save_every_n_steps=2, save_state=True,
    )  # fmt: skip
    _stop_after(monkeypatch, 4)
    assert train(config) == 130
    monkeypatch.undo()
    resumed = out / "run-step00000004-state"
    removed_while_only = []
    original = Saver.after_step

    def watch(self, global_step):
        original(self, global_step)
        newer = [p for p in out.glob("run-step*-state") if p.name > resumed.name]
        if not resumed.exists() and not newer:
            removed_while_only.append(global_step)

    monkeypatch.setattr(Saver, "after_step", watch)
    flag = "true" if save_state else "false"
    args = ["--resume", str(resumed), "--save_state", flag, "--save_last_n_steps", "1"]
    assert train(config, *args) == 0
    assert removed_while_only == []  # never gone while it was the newest state
    weights, states = _left(out, r"run-step(\d{8})")
    assert weights == {6}  # weights: save_last_n_steps = 1 at step 6 leaves step 6
    if save_state:
        # its own states prune the older ones once step 6's state is written
        assert states == {6}
    else:
        # no state written by this run: the earlier states stay, the resumed one included
        assert states == {2, 4}
        progress = json.loads((resumed / "progress.json").read_text(encoding="utf-8"))
        assert progress["global_step"] == 4
