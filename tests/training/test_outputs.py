import re

import pytest

from library.config.schema import SavingSection
from library.errors import ConfigError
from library.saving.outputs import OutputLayout
from tests.saving.sd_scripts_pruning import sd_scripts_epochs, sd_scripts_steps


def _touch(path):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"x")
    return path


def test_names_follow_kohya(tmp_path):
    layout = OutputLayout(SavingSection(output_dir=str(tmp_path), output_name="run"))
    assert layout.final.name == "run.safetensors"
    assert layout.step_file(500).name == "run-step00000500.safetensors"
    assert layout.epoch_file(3).name == "run-000003.safetensors"
    assert layout.state_of(layout.step_file(500)).name == "run-step00000500-state"


def test_existing_output_is_refused_unless_resume_or_overwrite(tmp_path):
    saving = SavingSection(output_dir=str(tmp_path), output_name="run")
    OutputLayout(saving).refuse_overwrite(resuming=False)  # nothing there yet
    _touch(tmp_path / "run-step00000010.safetensors")
    _touch(tmp_path / "other.safetensors")
    with pytest.raises(ConfigError, match="run-step00000010.safetensors already exists"):
        OutputLayout(saving).refuse_overwrite(resuming=False)
    OutputLayout(saving).refuse_overwrite(resuming=True)
    OutputLayout(saving.model_copy(update={"overwrite": True})).refuse_overwrite(resuming=False)
    # a different output_name that merely shares a prefix is not ours
    OutputLayout(saving.model_copy(update={"output_name": "ru"})).refuse_overwrite(False)


def test_prune_steps_keeps_the_last_n_steps(tmp_path):
    saving = SavingSection(
        output_dir=str(tmp_path), output_name="run", save_every_n_steps=10, save_last_n_steps=20
    )
    layout = OutputLayout(saving)
    for step in (10, 20, 30, 40, 50):
        _touch(layout.step_file(step))
        _touch(layout.state_of(layout.step_file(step)) / "progress.json")
    _touch(layout.ema_of(layout.step_file(20)))
    _touch(layout.ema_of(layout.step_file(30)))
    removed = layout.prune_steps(50, states=True)  # this save wrote a state too
    left = sorted(p.name for p in tmp_path.iterdir())
    assert len(removed) == 5
    assert left == [
        "run-step00000030-ema.safetensors",
        "run-step00000030-state",
        "run-step00000030.safetensors",
        "run-step00000040-state",
        "run-step00000040.safetensors",
        "run-step00000050-state",
        "run-step00000050.safetensors",
    ]


def test_prune_epochs_keeps_the_last_n_saves(tmp_path):
    saving = SavingSection(
        output_dir=str(tmp_path), output_name="run", save_every_n_epochs=2, save_last_n_epochs=2
    )
    layout = OutputLayout(saving)
    for epoch in (2, 4, 6):
        _touch(layout.epoch_file(epoch))
    layout.prune_epochs(6)
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "run-000004.safetensors",
        "run-000006.safetensors",
    ]


def _left(folder, numbered: str) -> tuple[set[int], set[int]]:
    """(numbers of the weights files left, numbers of the state folders left)."""
    weights, states = set(), set()
    for path in folder.iterdir():
        found = re.fullmatch(numbered + r"(\.safetensors|-state)", path.name)
        if found:
            (weights if found.group(2) == ".safetensors" else states).add(int(found.group(1)))
    return weights, states


STEP_WINDOWS = [  # every, save_last_n_steps, save_last_n_steps_state
    (10, 20, None),
    (10, 10, 30),
    (10, None, 20),
    (10, 40, 10),
    (7, 15, 8),
    (5, 3, None),
]


@pytest.mark.parametrize(("every", "last", "last_state"), STEP_WINDOWS)
def test_step_saves_and_states_are_pruned_as_sd_scripts_does(tmp_path, every, last, last_state):
    saving = SavingSection(
        output_dir=str(tmp_path), output_name="run", save_every_n_steps=every,
        save_last_n_steps=last, save_last_n_steps_state=last_state,
    )  # fmt: skip
    layout = OutputLayout(saving)
    saves = range(every, 12 * every + 1, every)
    for step in saves:
        _touch(layout.step_file(step))
        _touch(layout.state_of(layout.step_file(step)) / "progress.json")
        layout.prune_steps(step, states=True)
    assert _left(tmp_path, r"run-step(\d{8})") == sd_scripts_steps(every, last, last_state, saves)


@pytest.mark.parametrize(("every", "last", "last_state"), [(1, 3, 1), (2, 2, None), (1, None, 2)])
def test_epoch_saves_and_states_are_pruned_as_sd_scripts_does(tmp_path, every, last, last_state):
    saving = SavingSection(
        output_dir=str(tmp_path), output_name="run", save_every_n_epochs=every,
        save_last_n_epochs=last, save_last_n_epochs_state=last_state,
    )  # fmt: skip
    layout = OutputLayout(saving)
    saves = range(every, 9 * every + 1, every)
    for epoch in saves:
        _touch(layout.epoch_file(epoch))
        _touch(layout.state_of(layout.epoch_file(epoch)) / "progress.json")
        layout.prune_epochs(epoch, states=True)
    assert _left(tmp_path, r"run-(\d{6})") == sd_scripts_epochs(every, last, last_state, saves)


def test_states_are_pruned_only_by_a_save_that_wrote_one(tmp_path):
    # a save without a state (save_state = false) leaves every state: the newest one may be
    # the only way to continue the run
    saving = SavingSection(
        output_dir=str(tmp_path), output_name="run", save_every_n_steps=10, save_last_n_steps=10
    )
    layout = OutputLayout(saving)
    for step in (10, 20):
        _touch(layout.state_of(layout.step_file(step)) / "progress.json")
    for step in (30, 40):
        _touch(layout.step_file(step))
        layout.prune_steps(step, states=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "run-step00000010-state", "run-step00000020-state",
        "run-step00000030.safetensors", "run-step00000040.safetensors",
    ]  # fmt: skip


def test_the_state_a_resume_started_from_is_protected(tmp_path):
    saving = SavingSection(
        output_dir=str(tmp_path), output_name="run", save_every_n_steps=10,
        save_last_n_steps=10, save_every_n_epochs=1, save_last_n_epochs=1,
    )  # fmt: skip
    layout = OutputLayout(saving)
    resumed = _touch(layout.state_of(layout.step_file(10)) / "progress.json").parent
    epoch_state = _touch(layout.state_of(layout.epoch_file(1)) / "progress.json").parent
    _touch(layout.state_of(layout.step_file(40)) / "progress.json")
    _touch(layout.state_of(layout.epoch_file(3)) / "progress.json")
    layout.prune_steps(40, states=True, protect=resumed)
    layout.prune_epochs(3, states=True, protect=epoch_state)
    assert resumed.is_dir() and epoch_state.is_dir()
    layout.prune_steps(40, states=True)
    assert not resumed.exists()


def _weights(path, session_id=None):
    import torch
    from safetensors.torch import save_file

    path.parent.mkdir(parents=True, exist_ok=True)
    metadata = {"ss_session_id": session_id} if session_id else {}
    save_file({"w": torch.zeros(1)}, str(path), metadata=metadata)
    return path


def _state(path, run_id=None):
    import json

    path.mkdir(parents=True, exist_ok=True)
    (path / "progress.json").write_text(json.dumps({"global_step": 3, "run_id": run_id}))
    return path


def test_a_resume_replaces_only_its_own_run_outputs(tmp_path):
    saving = SavingSection(output_dir=str(tmp_path), output_name="run")
    layout = OutputLayout(saving)
    _weights(tmp_path / "run-step00000003.safetensors", "111")
    _state(tmp_path / "run-step00000003-state", "111")
    _weights(tmp_path / "run.safetensors", "111")
    (tmp_path / "run").mkdir()  # a diffusers folder written with run.safetensors
    layout.refuse_overwrite(resuming=True, run_id="111")
    _weights(tmp_path / "run-000002.safetensors", "222")  # another run's epoch save
    with pytest.raises(ConfigError, match="run-000002.safetensors was not written by the run"):
        layout.refuse_overwrite(resuming=True, run_id="111")
    (tmp_path / "run-000002.safetensors").unlink()
    _weights(tmp_path / "run-000004.safetensors")  # no run id: e.g. written by another tool
    with pytest.raises(ConfigError, match="run-000004.safetensors was not written"):
        layout.refuse_overwrite(resuming=True, run_id="111")
    layout.refuse_overwrite(resuming=True, run_id=None)  # a state from an older difftune
    OutputLayout(saving.model_copy(update={"overwrite": True})).refuse_overwrite(True, "111")


def test_refusal_names_the_exact_resume_or_overwrite(tmp_path):
    saving = SavingSection(output_dir=str(tmp_path), output_name="run")
    _touch(tmp_path / "run-step00000005.safetensors")  # killed during the first save
    with pytest.raises(ConfigError) as info:
        OutputLayout(saving).refuse_overwrite(resuming=False)
    assert "replace it with --overwrite" in str(info.value) and "--resume" not in str(info.value)
    _state(tmp_path / "run-step00000005-state")
    _state(tmp_path / "run-step00000010-state").joinpath("progress.json").write_text(
        '{"global_step": 10}'
    )
    with pytest.raises(ConfigError) as info:
        OutputLayout(saving).refuse_overwrite(resuming=False)
    assert f"continue that run with --resume {tmp_path / 'run-step00000010-state'}" in str(
        info.value
    )


def test_leftovers_of_this_output_name_are_removed(tmp_path):
    layout = OutputLayout(SavingSection(output_dir=str(tmp_path), output_name="run"))
    ours = [
        _touch(tmp_path / ".run.safetensors.a1b2.tmp"),
        _touch(tmp_path / ".run-step00000010.safetensors.x9.tmp"),
        _touch(tmp_path / ".run-step00000010-state.q7.tmp" / "trained.safetensors"),
        _touch(tmp_path / ".run-state.z3.old" / "progress.json"),
    ]
    theirs = [
        _touch(tmp_path / ".runner.safetensors.k2.tmp"),  # another output name sharing "run"
        _touch(tmp_path / ".other.safetensors.m4.tmp"),
        _touch(tmp_path / "run.safetensors"),
        _touch(tmp_path / "run-state" / "progress.json"),  # the new state the .old gave way to
    ]
    removed = layout.remove_leftovers()
    assert len(removed) == len(ours)
    assert not any(p.exists() for p in ours[:2]) and not (tmp_path / ".run-state.z3.old").exists()
    assert all(p.exists() for p in theirs)


def test_a_folder_set_aside_by_a_killed_swap_is_put_back(tmp_path):
    """A folder write killed between its two renames leaves the previous folder as ``.old``
    and nothing at the output's name: that folder is the only copy, so it is moved back."""
    layout = OutputLayout(SavingSection(output_dir=str(tmp_path), output_name="run"))
    (tmp_path / ".run-state.z3.old").mkdir()
    (tmp_path / ".run-state.z3.old" / "progress.json").write_text("previous")
    _touch(tmp_path / ".run-state.k1.tmp" / "progress.json")  # the new one, never renamed
    assert layout.remove_leftovers() == [tmp_path / ".run-state.k1.tmp"]
    assert (tmp_path / "run-state" / "progress.json").read_text() == "previous"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run-state"]


def _earlier_run(folder):
    """An earlier run of "run" in ``folder`` (outputs, summary, samples) beside another name's
    files and the user's own."""
    ours = [
        _touch(folder / "run.safetensors"),
        _touch(folder / "run-step00000100.safetensors"),
        _touch(folder / "run-step00000100-state" / "progress.json"),
        _touch(folder / "run-000002-ema.safetensors"),
        _touch(folder / "run-summary.json"),
    ]
    samples = [
        _touch(folder / "sample" / "run_000100_00_42.png"),
        _touch(folder / "sample" / "run_000100_grid.png"),
    ]
    others = [
        _touch(folder / "runner.safetensors"),
        _touch(folder / "run.lock"),
        _touch(folder / "sample" / "runner_000100_00_42.png"),
        _touch(folder / "sample" / "my-notes.png"),
        _touch(folder / "notes.txt"),
    ]
    return ours, samples, others


def test_overwrite_moves_the_earlier_runs_files_to_a_dated_folder(tmp_path):
    import time

    ours, samples, others = _earlier_run(tmp_path)
    layout = OutputLayout(
        SavingSection(output_dir=str(tmp_path), output_name="run", overwrite=True)
    )
    when = time.mktime((2026, 12, 7, 10, 15, 0, 0, 0, -1))
    folder = layout.set_aside(when)
    assert folder == tmp_path / "run-replaced-2026-12-07_101500"
    moved = {p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file()}
    expected = {p.relative_to(tmp_path).as_posix() for p in ours + samples}
    assert moved == expected
    assert not any(p.exists() for p in ours + samples) and all(p.exists() for p in others)
    assert layout.existing_outputs() == []  # the folder is no output of this name (nor another's)
    assert (
        OutputLayout(SavingSection(output_dir=str(tmp_path), output_name="run")).writes(folder.name)
        is False
    )
    assert layout.set_aside(when) is None  # nothing left to move
    _touch(tmp_path / "run.safetensors")
    assert layout.set_aside(when).name == "run-replaced-2026-12-07_101500_2"


def test_the_plan_says_what_overwrite_moves_aside(tmp_path):
    from types import SimpleNamespace

    from library.training.plan import _set_aside_lines

    saving = SavingSection(output_dir=str(tmp_path), output_name="run", overwrite=True)
    assert _set_aside_lines(SimpleNamespace(saving=saving)) == []  # nothing there yet
    ours, samples, _ = _earlier_run(tmp_path)
    (line,) = _set_aside_lines(SimpleNamespace(saving=saving))
    assert line == (
        f"first (--overwrite): the earlier run's {len(ours) - 1} outputs and {len(samples)} "
        f"sample images of this name move to {tmp_path / 'run-replaced-'}<date>_<time>, so none "
        "is left among this run's"
    )
    # a resume continues the earlier run, and without --overwrite the run is refused
    resume = saving.model_copy(update={"resume": str(ours[2].parent)})
    assert _set_aside_lines(SimpleNamespace(saving=resume)) == []
    plain = saving.model_copy(update={"overwrite": False})
    assert _set_aside_lines(SimpleNamespace(saving=plain)) == []


def test_an_experts_files_are_its_output_names_and_pruned_with_them(tmp_path):
    """Each denoiser expert's weights carry its name before the suffix; they are this output
    name's outputs (refused, pruned, described as its own) and no other name's."""
    from library.saving.output_names import expert_file, is_output, owner_of

    layout = OutputLayout(SavingSection(output_dir=str(tmp_path), output_name="run",
                                        save_every_n_steps=10, save_last_n_steps=10))  # fmt: skip
    final = expert_file(layout.final, "high_noise")
    assert final.name == "run_high_noise.safetensors"
    ema = expert_file(layout.ema_of(layout.step_file(10)), "low_noise")
    assert ema.name == "run-step00000010_low_noise-ema.safetensors"
    for path in (final, ema, expert_file(layout.step_file(20), "low_noise")):
        assert is_output("run", path.name) and owner_of(path.name) == "run"
        assert not is_output("ru", path.name)
        _touch(path)
    assert layout.describe(ema) == {"path": str(ema.absolute()), "expert": "low_noise",
                                    "kind": "ema weights", "step": 10}  # fmt: skip
    with pytest.raises(ConfigError, match=r"low_noise-ema.safetensors \(and 2 more\) already"):
        layout.refuse_overwrite(resuming=False)
    layout.prune_steps(30)  # keeps the saves of the last 10 steps
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "run-step00000020_low_noise.safetensors", "run_high_noise.safetensors"
    ]  # fmt: skip


def test_an_output_name_may_not_end_like_an_experts_file():
    with pytest.raises(ValueError, match='ends in "_high_noise".*"wan-high-noise"'):
        SavingSection(output_name="wan_high_noise")
