"""The free-space estimate counts what a run really leaves in output_dir; the check's message;
where rescued weights go."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from library.config.schema import SavingSection
from library.saving import disk_space
from library.saving.disk_space import (
    Estimate,
    SaveSizes,
    estimate_run,
    format_size,
    rescue_folders,
    rescue_name,
    space_problem,
)
from library.saving.outputs import OutputLayout
from tests.integration.harness import make_images, train, write_config


def _leave_outputs(
    saving: SavingSection, total: int, per_epoch: int, epochs: int, start: int
) -> int:
    """Make and prune saves on the Saver's cadence (after_step / after_epoch), one file each;
    return how many are left at the end."""
    layout = OutputLayout(saving)
    layout.dir.mkdir(parents=True, exist_ok=True)
    for step in range(start + 1, total + 1):
        if layout.step_due(step, total):
            layout.step_file(step).write_bytes(b"w")
            layout.prune_steps(step)
        epoch = step // per_epoch
        if step % per_epoch == 0 and step < total and layout.epoch_due(epoch, epochs):
            layout.epoch_file(epoch).write_bytes(b"w")
            layout.prune_epochs(epoch)
    return len(layout.existing_outputs())


CADENCES = [
    # every_n_steps, last_n_steps, every_n_epochs, last_n_epochs, total, per_epoch, start
    (None, None, None, None, 40, 10, 0),
    (5, None, None, None, 40, 10, 0),
    (5, 12, None, None, 40, 10, 0),
    (5, 3, None, None, 40, 10, 0),
    (4, 8, None, None, 40, 10, 0),
    (None, None, 1, None, 40, 10, 0),
    (None, None, 2, 2, 95, 10, 0),
    (None, None, 1, 3, 40, 10, 0),
    (7, 14, 1, 2, 60, 9, 0),
    (5, None, 1, None, 40, 10, 23),  # a resume at step 23: earlier saves are on disk already
    (5, 10, 2, 1, 40, 10, 20),
]


@pytest.mark.parametrize(
    "every, last, every_epochs, last_epochs, total, per_epoch, start", CADENCES
)
def test_counted_saves_are_those_the_cadence_leaves(
    tmp_path, every, last, every_epochs, last_epochs, total, per_epoch, start
):
    saving = SavingSection(
        output_dir=str(tmp_path), output_name="run", save_every_n_steps=every,
        save_last_n_steps=last, save_every_n_epochs=every_epochs, save_last_n_epochs=last_epochs,
    )  # fmt: skip
    epochs = -(-total // per_epoch)
    left = _leave_outputs(saving, total, per_epoch, epochs, start)
    estimate = estimate_run(saving, SaveSizes(1, 0, 0, False), total, per_epoch, epochs, start)
    assert estimate.bytes == 1 + left  # the final file and every save still there at the end
    counted = sum(
        int(n) for n in re.findall(r"(\d+) (?:step|epoch) saves?", " ".join(estimate.parts))
    )
    assert counted == left


@pytest.mark.parametrize(
    "steps, states, epochs, epoch_states",
    [(10, 30, None, None), (30, 10, None, None), (None, 10, 1, None), (None, None, 3, 1)],
)
def test_states_kept_by_their_own_windows_are_counted(tmp_path, steps, states, epochs, epoch_states):
    saving = SavingSection(
        output_dir=str(tmp_path), output_name="run", save_state=True, save_every_n_steps=10,
        save_last_n_steps=steps, save_last_n_steps_state=states, save_every_n_epochs=1,
        save_last_n_epochs=epochs, save_last_n_epochs_state=epoch_states,
    )  # fmt: skip
    layout = OutputLayout(saving)
    layout.dir.mkdir(parents=True, exist_ok=True)
    total, per_epoch = 100, 25
    for step in range(1, total):
        if layout.step_due(step, total):
            layout.step_file(step).write_bytes(b"w")
            layout.state_of(layout.step_file(step)).mkdir()
            layout.prune_steps(step, states=True)
        if step % per_epoch == 0:
            layout.epoch_file(step // per_epoch).write_bytes(b"w")
            layout.state_of(layout.epoch_file(step // per_epoch)).mkdir()
            layout.prune_epochs(step // per_epoch, states=True)
    left = layout.existing_outputs()
    folders = sum(p.is_dir() for p in left)
    estimate = estimate_run(saving, SaveSizes(1, 0, 1000, False), total, per_epoch, 4)
    # the final file and final state, and every weights file and state still there at the end
    assert estimate.bytes == 1 + 1000 + (len(left) - folders) + 1000 * folders


def test_states_ema_and_the_final_folder_are_counted(tmp_path):
    saving = SavingSection(
        output_dir=str(tmp_path), save_every_n_steps=10, save_last_n_steps=10, save_state=True
    )
    sizes = SaveSizes(weights=100, final_folder=5000, state=1000, ema=True)
    estimate = estimate_run(saving, sizes, 100, 10, 10)
    # two step saves (weights, EMA copy, state each), then the final file, EMA copy, folder, state
    assert estimate.bytes == 2 * (100 + 100 + 1000) + (100 + 100 + 5000) + 1000
    assert estimate.parts == ("final file and folder", "2 step saves", "states", "EMA copies")

    end_only = SavingSection(output_dir=str(tmp_path), save_state_on_train_end=True)
    assert estimate_run(end_only, sizes, 100, 10, 10).bytes == 100 + 100 + 5000 + 1000


def test_saved_optimizer_state_is_sized_like_the_one_in_memory():
    # one table serves the memory and the disk estimate; tests/training/test_memory_estimate.py
    # checks it against real optimizers' state (8-bit state is 32-bit below 4096 elements)
    import torch

    from library.training.memory_estimate import optimizer_state_bytes

    big, small = torch.nn.Parameter(torch.zeros(8192)), torch.nn.Parameter(torch.zeros(1000))
    assert optimizer_state_bytes("AdamW", [small], {}) == 8000
    assert optimizer_state_bytes("AdamW8bit", [small], {}) == 8000
    assert optimizer_state_bytes("AdamW8bit", [big], {}) == 2 * (8192 + 32 * 4)
    assert optimizer_state_bytes("Lion", [small], {}) == 4000
    assert optimizer_state_bytes("Prodigy", [small], {}) == 16000
    assert optimizer_state_bytes("torch.optim.RMSprop", [small], {}) == 8000


def _disk_with_free(monkeypatch, free: int) -> None:
    real = shutil.disk_usage

    def fake(path):
        return real(path)._replace(free=free)

    monkeypatch.setattr(disk_space.shutil, "disk_usage", fake)


def test_too_little_space_is_one_line_naming_the_folder(tmp_path, monkeypatch):
    estimate = Estimate(int(7.5 * 2**30), ("final file", "3 step saves", "states"))
    _disk_with_free(monkeypatch, 3 * 2**30)
    message = space_problem(tmp_path, estimate)
    assert message == (
        f"output_dir {tmp_path} has 3.0 GiB free; this run writes about 7.5 GiB (final file + "
        "3 step saves + states); free space or choose another output_dir"
    )
    _disk_with_free(monkeypatch, 8 * 2**30)
    assert space_problem(tmp_path, estimate) is None


def test_sizes_read_as_people_write_them():
    assert format_size(3 * 2**30 + 2**29) == "3.5 GiB"
    assert format_size(850 * 2**20) == "850 MiB"
    assert format_size(12 * 2**10) == "12 KiB"


def test_rescue_goes_home_first_then_to_the_temp_folder(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setattr(disk_space.tempfile, "tempdir", str(tmp_path / "tmp"))
    assert rescue_folders() == [
        tmp_path / "home" / "difftune-rescue",
        tmp_path / "tmp" / "difftune-rescue",
    ]
    stamp = 1_764_584_100.0  # a fixed time: the name carries it to the second
    name = rescue_name(Path("out/run-step00000500.safetensors"), stamp)
    assert re.fullmatch(r"run-step00000500-\d{8}-\d{6}\.safetensors", name)


# --- the estimate against the outputs of real runs --------------------------------------------


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    return make_images(tmp_path_factory.mktemp("data") / "imgs", 2)


def _spy_estimates(monkeypatch) -> list[tuple[Estimate, Estimate]]:
    """Record the run's estimate twice: as made, and without the allowance for headers."""
    from library.training import saver

    real_sizes, bare_sizes, seen = disk_space.save_sizes, [], []

    def sizes(config, parts, ema):
        with monkeypatch.context() as patch:
            patch.setattr(disk_space, "FILE_OVERHEAD", 0)
            bare_sizes.append(real_sizes(config, parts, ema))
        return real_sizes(config, parts, ema)

    def estimate(saving, sizes, *plan):
        seen.append(
            (estimate_run(saving, sizes, *plan), estimate_run(saving, bare_sizes[-1], *plan))
        )
        return seen[-1][0]

    monkeypatch.setattr(saver, "save_sizes", sizes)
    monkeypatch.setattr(saver, "estimate_run", estimate)
    return seen


def _written(out: Path) -> int:
    """Bytes of the run's outputs (files, states, the diffusers folder), not its lock file."""
    outputs = OutputLayout(SavingSection(output_dir=str(out), output_name="run")).existing_outputs()
    files = [f for path in outputs for f in ([path] if path.is_file() else path.rglob("*"))]
    return sum(f.stat().st_size for f in files if f.is_file())


@pytest.mark.parametrize(
    "keys",
    [
        dict(save_every_n_steps=1, save_last_n_steps=2, save_state=True, ema_decay=0.9),
        dict(save_precision="fp16", save_every_n_steps=2, optimizer_type="Lion"),
        dict(train_mode="unet", save_precision="fp16", save_state_on_train_end=True),
    ],
    ids=["lora-states-ema", "lora-fp16-lion", "unet-checkpoint-and-folder"],
)
@pytest.mark.integration
def test_estimate_brackets_what_a_run_writes(tmp_path, tiny_model_dir, images, monkeypatch, keys):
    seen = _spy_estimates(monkeypatch)
    out = tmp_path / "out"
    config = write_config(
        tmp_path / "c.toml", tiny_model_dir, images, out, max_train_steps=5, **keys
    )
    assert train(config, "--logging_dir", str(tmp_path / "logs")) == 0
    ((estimate, bare),) = seen
    written = _written(out)
    # tensors alone never exceed the files; with the allowance for headers, the estimate covers them
    assert bare.bytes <= written <= estimate.bytes, (bare.bytes, written, estimate.bytes)
