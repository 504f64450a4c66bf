"""A toolbox command whose output's disk is full says so in one line naming the option that
chose the output (--output, --output_dir), not the trainer's output_dir, and leaves nothing."""

from __future__ import annotations

import errno
import shutil

import pytest

from library.saving import atomic
from tests.lora_tools.model_helpers import TrainedLora, error_lines, load, model_dir, run_tool


@pytest.fixture(scope="module")
def sd1(tmp_path_factory, kit_folders):
    root = tmp_path_factory.mktemp("full-disk")
    base = shutil.copytree(model_dir("sd1", kit_folders), root / "sd15")
    lora = TrainedLora(load(base), rank=2, alpha=2.0, seed=5).save(root / "lora.safetensors")
    return {"model": base, "lora": lora}


@pytest.mark.parametrize(("option", "name"), [("--output", "merged.safetensors"),
                                              ("--output_dir", "merged")])  # fmt: skip
def test_merge_on_a_full_disk_names_its_output_option(sd1, tmp_path, monkeypatch, capsys,
                                                      option, name):  # fmt: skip
    def full(_fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(atomic.os, "fsync", full)
    out = tmp_path / name
    code = run_tool("merge", "--model", sd1["model"], "--loras", sd1["lora"], option, out)
    assert code == 1
    (line,) = error_lines(capsys.readouterr().err)
    assert line == (
        f"error: cannot write {out}: no space left on device; free space or choose another {option}"
    )
    assert list(tmp_path.iterdir()) == []  # no temporary, no lock file left
