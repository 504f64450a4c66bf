import pytest

from library.config.schema import SavingSection
from library.errors import ConfigError
from library.saving.outputs import OutputLayout


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
    removed = layout.prune_steps(50)
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
