"""An image that breaks while 2 processes train: neither process waits for the other at a
collective. Without skip_bad_images both stop after the same step with one state, which resumes
(here on 1 process x accumulation 2, the same effective batch) to the weights of a run that never
broke; with skip_bad_images both train on, to the weights of the same damage on 1 process."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from library.sampling.runner import SampleRunner
from tests.distributed.runs import REPO, in_process, torchrun
from tests.integration.harness import assert_close_dicts, make_images, tensors, write_config

SCRIPT = REPO / "tests" / "distributed" / "break_image.py"
BROKEN = "img02.png"
KEYS = {"max_train_epochs": 4, "train_batch_size": 1}  # 4 images, 2 per step: 8 steps
# Another layout sums in another order (see test_equivalence); over 8 AdamW steps that grows
# to a few 1e-6, against differences above 1e-3 between the runs told apart here.
ATOL, RTOL = 2e-5, 1e-5


@pytest.fixture
def images(tmp_path):
    return make_images(tmp_path / "imgs", 4)


def _config(tmp_path: Path, images: Path, model: Path, name: str, accumulation: int, **keys):
    return write_config(
        tmp_path / f"{name}.toml", model, images, tmp_path / name,
        gradient_accumulation_steps=accumulation, **KEYS, **keys,
    )  # fmt: skip


def _damaged_at_start(monkeypatch, path: Path) -> None:
    original = SampleRunner.at_start

    def at_start(self, global_step):
        path.write_bytes(path.read_bytes()[:40])
        original(self, global_step)

    monkeypatch.setattr(SampleRunner, "at_start", at_start)


def test_both_processes_stop_with_one_state_that_resumes(tmp_path, tiny_model_dir, images):
    good = (images / BROKEN).read_bytes()
    config = _config(tmp_path, images, tiny_model_dir, "two", 1)
    run = torchrun(
        config, "--break_image", f"{images / BROKEN}:2", out=tmp_path / "two", script=SCRIPT
    )
    assert len(re.findall(r"exitcode\s*: 1 ", run.log)) == 2, run.log[-4000:]  # both, no hang
    errors = re.findall(r"(?m)^error: (.*)$", run.log)
    assert len(errors) == 1 and BROKEN in errors[0], run.log[-4000:]  # the main process's line
    match = re.search(
        r"after optimizer step (\d+) with its state saved; .* --resume (\S+)", errors[0]
    )
    assert match, errors[0]
    step, state = int(match.group(1)), Path(match.group(2))
    progress = json.loads((state / "progress.json").read_text(encoding="utf-8"))
    assert progress["global_step"] == step and progress["world_size"] == 2 and 2 <= step < 8
    summary = json.loads((tmp_path / "two" / "run-summary.json").read_text(encoding="utf-8"))
    assert (summary["exit_code"], summary["steps_done"]) == (1, step)

    (images / BROKEN).write_bytes(good)
    straight = _config(tmp_path, images, tiny_model_dir, "straight", 2)
    in_process(straight, out=tmp_path / "straight").check()
    resume = ("--resume", str(state), "--gradient_accumulation_steps", "2")
    in_process(config, *resume, out=tmp_path / "two").check()
    assert_close_dicts(
        _weights(tmp_path / "two"), _weights(tmp_path / "straight"), atol=ATOL, rtol=RTOL
    )


def test_skip_bad_images_trains_on_like_one_process(tmp_path, tiny_model_dir, images, monkeypatch):
    good = (images / BROKEN).read_bytes()
    config = _config(tmp_path, images, tiny_model_dir, "two", 1, skip_bad_images=True)
    run = torchrun(
        config, "--break_image", f"{images / BROKEN}:0", out=tmp_path / "two", script=SCRIPT
    ).check()
    assert run.log.count(f"(skip_bad_images): image {images / BROKEN}") == 1, run.log[-4000:]

    (images / BROKEN).write_bytes(good)
    one = _config(tmp_path, images, tiny_model_dir, "one", 2, skip_bad_images=True)
    _damaged_at_start(monkeypatch, images / BROKEN)
    in_process(one, out=tmp_path / "one").check()
    assert_close_dicts(_weights(tmp_path / "two"), _weights(tmp_path / "one"), atol=ATOL, rtol=RTOL)
    monkeypatch.undo()
    (images / BROKEN).write_bytes(good)
    whole = _config(tmp_path, images, tiny_model_dir, "whole", 2, skip_bad_images=True)
    in_process(whole, out=tmp_path / "whole").check()
    one, whole = _weights(tmp_path / "one"), _weights(tmp_path / "whole")
    assert max((one[k] - whole[k]).abs().max().item() for k in one) > 100 * ATOL  # guard


def _weights(out: Path) -> dict:
    return tensors(out / "run.safetensors")
