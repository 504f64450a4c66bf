"""When output_dir cannot take the run's outputs: refused before the first step when the space is
known to be short; at a failed save, one error line and the trained weights kept elsewhere."""

from __future__ import annotations

import errno
import json
import re
import shutil
import tempfile
import time
from pathlib import Path

import pytest
import torch

from library.saving import disk_space
from tests.integration.harness import assert_close_dicts, make_images, tensors, train, write_config

NO_SPACE = OSError(errno.ENOSPC, "No space left on device")


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    return make_images(tmp_path_factory.mktemp("data") / "imgs", 3)


@pytest.fixture
def rescue_home(tmp_path, monkeypatch):
    """HOME and the temp folder of this test, so rescued files land in tmp_path."""
    home, temp = tmp_path / "home", tmp_path / "tmp"
    home.mkdir()
    temp.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setattr(tempfile, "tempdir", str(temp))
    return home


def _error_lines(stderr: str) -> list[str]:
    """The CLI's "error: ..." lines. A run that fails mid-way leaves its progress bar open, so
    the line may follow the bar's last frame ("...lr=1.00e-03]error: ...") rather than a newline,
    after the cursor movements tqdm writes when several bars were made in one process."""
    plain = re.sub(r"\x1b\[[0-9;]*[A-Za-z]", "", stderr)
    return re.findall(r"(?m)(?:^|(?<=\]))error: .*$", plain)


def _counted(monkeypatch, owner: str, name: str) -> list[int]:
    """Replace ``owner.name`` by a wrapper that counts its calls; return the one-item counter."""
    import importlib

    module = importlib.import_module(owner)
    real, calls = getattr(module, name), [0]

    def counting(*args, **kwargs):
        calls[0] += 1
        return real(*args, **kwargs)

    monkeypatch.setattr(module, name, counting)
    return calls


def test_too_little_free_space_stops_before_the_first_step(
    tmp_path, tiny_model_dir, images, monkeypatch, capsys
):
    out = tmp_path / "out"
    real_usage = shutil.disk_usage

    def usage(path):  # output_dir's disk has 1 KiB left; every other disk is as it is
        found = real_usage(path)
        return found._replace(free=1024) if Path(path) == out else found

    monkeypatch.setattr(disk_space.shutil, "disk_usage", usage)
    loads = _counted(monkeypatch, "library.training.trainer", "load_components")
    losses = _counted(monkeypatch, "library.training.trainer", "micro_batch_loss")
    config = write_config(
        tmp_path / "c.toml", tiny_model_dir, images, out,
        max_train_steps=3, save_every_n_steps=1, save_state=True,
    )  # fmt: skip
    assert train(config) == 2
    errors = _error_lines(capsys.readouterr().err)
    assert len(errors) == 1
    assert re.fullmatch(
        rf"error: output_dir {re.escape(str(out))} has 1 KiB free; "
        r"this run writes about \d+ [KM]iB \(final file \+ 2 step saves \+ states\); "
        r"free space or choose another output_dir",
        errors[0],
    ), errors[0]
    assert loads == [1] and losses == [0]  # the models loaded; not one step was trained
    # no output; the run summary (not an output) says how it ended
    assert not any(
        p.name.startswith("run") and p.name not in ("run.lock", "run-summary.json")
        for p in out.iterdir()
    )
    assert json.loads((out / "run-summary.json").read_text())["exit_code"] == 2


def _fail_writes(monkeypatch, *targets: Path) -> dict:
    """Make the LoRA writer (safetensors' save_file) fail with ENOSPC for the files ``targets``
    and for anything inside a ``targets`` folder; returns a switch: ``switch["on"] = False``
    frees the space."""
    import safetensors.torch

    real, switch = safetensors.torch.save_file, {"on": True}

    def save_file(tensors, filename, metadata=None):
        written = Path(filename)  # the temporary beside the output: .<name>.<random>.tmp
        output = written.parent / written.name[1:].rsplit(".", 2)[0]
        if switch["on"] and any(output == t or written.is_relative_to(t) for t in targets):
            raise NO_SPACE
        return real(tensors, filename, metadata=metadata)

    monkeypatch.setattr(safetensors.torch, "save_file", save_file)
    return switch


def test_a_failed_final_save_leaves_the_weights_in_the_rescue_folder(
    tmp_path, tiny_model_dir, images, monkeypatch, capsys, rescue_home
):
    keys = dict(max_train_steps=4, ema_decay=0.9)
    normal = write_config(
        tmp_path / "normal.toml", tiny_model_dir, images, tmp_path / "normal", **keys
    )
    assert train(normal) == 0
    capsys.readouterr()

    out = tmp_path / "out"
    _fail_writes(monkeypatch, out / "run.safetensors")
    config = write_config(tmp_path / "c.toml", tiny_model_dir, images, out, **keys)
    assert train(config) == 1
    captured = capsys.readouterr()
    errors = _error_lines(captured.err)
    assert len(errors) == 1, captured.err[-3000:] + captured.out[-3000:]
    final = out / "run.safetensors"
    match = re.fullmatch(
        rf"error: cannot write {re.escape(str(final))}: no space left on device; the trained "
        r"weights were saved to (\S+) instead",
        errors[0],
    )
    assert match, errors[0]
    rescued = Path(match.group(1))
    assert rescued.parent == rescue_home / "difftune-rescue"
    assert re.fullmatch(r"run-\d{8}-\d{6}\.safetensors", rescued.name)
    assert not final.exists() and not list(out.glob(".run.safetensors.*"))

    # the same tensors a run with room writes, EMA copy included
    for mine, theirs in ((rescued, tmp_path / "normal" / "run.safetensors"),
                         (rescued.with_name(rescued.stem + "-ema.safetensors"),
                          tmp_path / "normal" / "run-ema.safetensors")):  # fmt: skip
        got, want = tensors(mine), tensors(theirs)
        assert got.keys() == want.keys()
        assert all(torch.equal(got[k], want[k]) for k in want)


def test_when_no_folder_takes_the_weights_the_last_state_is_named(
    tmp_path, tiny_model_dir, images, monkeypatch, capsys, rescue_home
):
    keys = dict(max_train_steps=4, save_every_n_steps=2, save_state=True)
    normal = write_config(
        tmp_path / "normal.toml", tiny_model_dir, images, tmp_path / "normal", **keys
    )
    assert train(normal) == 0
    capsys.readouterr()

    out = tmp_path / "out"
    folders = disk_space.rescue_folders()
    assert folders == [rescue_home / "difftune-rescue", tmp_path / "tmp" / "difftune-rescue"]
    space = _fail_writes(monkeypatch, out / "run.safetensors", *folders)  # every disk is full
    config = write_config(tmp_path / "c.toml", tiny_model_dir, images, out, **keys)
    assert train(config) == 1
    errors = _error_lines(capsys.readouterr().err)
    state = out / "run-step00000002-state"
    assert errors == [
        f"error: cannot write {out / 'run.safetensors'}: no space left on device; writing them to "
        f"{folders[0]} or {folders[1]} failed too; the last state is {state}; resume from it after "
        "freeing space"
    ]
    assert state.is_dir() and not any(f.is_file() for d in folders for f in d.rglob("*"))

    space["on"] = False  # space was freed: the named state finishes the run as if nothing happened
    assert train(config, "--resume", str(state)) == 0
    assert_close_dicts(
        tensors(out / "run.safetensors"),
        tensors(tmp_path / "normal" / "run.safetensors"),
        atol=1e-6,
    )


DEV_FULL = Path("/dev/full")


@pytest.mark.skipif(not DEV_FULL.exists(), reason="needs Linux's /dev/full")
def test_a_failed_state_save_names_the_last_state(
    tmp_path, tiny_model_dir, images, monkeypatch, capsys
):
    out = tmp_path / "out"
    real_save, real_usage, full = torch.save, shutil.disk_usage, {"now": False}

    def save(obj, f, *args, **kwargs):
        # the optimizer file of step 4's state goes to a device that is full, for real
        if isinstance(f, (str, Path)) and Path(f).parent.name.startswith(
            ".run-step00000004-state."
        ):
            full["now"] = True
            Path(f).symlink_to(DEV_FULL)
        return real_save(obj, f, *args, **kwargs)

    def usage(path):  # torch reports no errno: the disk's free space tells
        found = real_usage(path)
        return found._replace(free=0) if full["now"] and Path(path) == out else found

    monkeypatch.setattr(torch, "save", save)
    monkeypatch.setattr(shutil, "disk_usage", usage)
    config = write_config(
        tmp_path / "c.toml",
        tiny_model_dir,
        images,
        out,
        max_train_steps=6,
        save_every_n_steps=2,
        save_state=True,
    )
    assert train(config) == 1
    stderr = capsys.readouterr().err
    errors = _error_lines(stderr)
    assert errors == [
        f"error: cannot write {out / 'run-step00000004-state'}: no space left on device; the last "
        f"state is {out / 'run-step00000002-state'}; resume from it after freeing space"
    ], stderr[-3000:]
    assert (out / "run-step00000004.safetensors").is_file()  # written before its state
    assert not (out / "run-step00000004-state").exists() and not list(out.glob(".*.tmp"))
    assert not (out / "run.safetensors").exists()


LAUNCHER = """
import errno, os, sys
from pathlib import Path

sys.path.insert(0, {repo!r})
import safetensors.torch

real, final = safetensors.torch.save_file, Path(os.environ["DIFFTUNE_TEST_FINAL"])


def save_file(tensors, filename, metadata=None):
    if Path(filename).parent == final.parent and Path(filename).name.startswith("." + final.name):
        raise OSError(errno.ENOSPC, "No space left on device")
    return real(tensors, filename, metadata=metadata)


safetensors.torch.save_file = save_file
from library.cli import main

code = main(sys.argv[1:])
(final.parent / ("rank" + os.environ["RANK"] + ".exit")).write_text(str(code))
sys.exit(code)
"""


def test_every_process_leaves_when_the_main_one_cannot_save(
    tmp_path, tiny_model_dir, images, monkeypatch, rescue_home
):
    # Only the main process writes; the others must learn of its failure and leave by themselves
    # rather than wait at a barrier for the DDP timeout (torchrun then kills them: no exit file)
    from tests.distributed.runs import REPO, torchrun

    out = tmp_path / "out"
    script = tmp_path / "launch.py"
    script.write_text(LAUNCHER.format(repo=str(REPO)), encoding="utf-8")
    monkeypatch.setenv("DIFFTUNE_TEST_FINAL", str(out / "run.safetensors"))
    config = write_config(
        tmp_path / "c.toml", tiny_model_dir, images, out, max_train_steps=2, ddp_timeout=5
    )
    started = time.monotonic()
    run = torchrun(config, out=out, script=script)
    assert run.returncode != 0
    assert time.monotonic() - started < 240
    exits = {
        rank: (out / f"rank{rank}.exit").read_text()
        for rank in (0, 1)
        if (out / f"rank{rank}.exit").exists()
    }
    assert exits == {0: "1", 1: "1"}, run.log[-3000:]
    errors = _error_lines(run.log)
    assert len(errors) == 1 and "the trained weights were saved to" in errors[0], run.log[-3000:]
    rescued = Path(errors[0].rsplit(" saved to ", 1)[1].removesuffix(" instead"))
    assert rescued.parent == rescue_home / "difftune-rescue" and rescued.is_file()
