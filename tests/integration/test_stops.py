"""Safe stops: SIGTERM leaves a resumable state; a non-finite loss follows nan_policy."""

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from tests.integration.harness import assert_close_dicts, make_images, tensors, train, write_config

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    return make_images(tmp_path_factory.mktemp("data") / "imgs", 3)


@pytest.mark.subprocess
def test_sigterm_saves_a_state_that_resumes_to_the_same_weights(tmp_path, tiny_model_dir, images):
    keys = dict(train_batch_size=1, max_train_steps=40, lr_scheduler="cosine", save_every_n_steps=1)
    straight = write_config(tmp_path / "a.toml", tiny_model_dir, images, tmp_path / "a", **keys)
    assert train(straight) == 0

    config = write_config(tmp_path / "b.toml", tiny_model_dir, images, tmp_path / "b", **keys)
    proc = subprocess.Popen(
        [sys.executable, str(REPO / "train_network.py"), "--config", str(config)],
        cwd=REPO, env={**os.environ, "HF_HUB_OFFLINE": "1"},
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    deadline = time.time() + 120
    while not (tmp_path / "b" / "run-step00000002.safetensors").exists():
        assert proc.poll() is None and time.time() < deadline, "training did not start"
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signal.SIGTERM, err[-2000:]
    match = re.search(r"stopped by SIGTERM after optimizer step (\d+); continue with --resume (\S+)", err)
    assert match, err[-2000:]
    stopped_at, state = int(match.group(1)), Path(match.group(2))
    assert 2 <= stopped_at < 40 and state.is_dir()
    assert not (tmp_path / "b" / "run.safetensors").exists()

    assert train(config, "--resume", str(state)) == 0
    assert_close_dicts(tensors(tmp_path / "a" / "run.safetensors"), tensors(tmp_path / "b" / "run.safetensors"), atol=1e-6)


def _poison_third_micro_batch(monkeypatch):
    from library.training import step as step_module

    real, calls = step_module.micro_batch_loss, {"n": 0}

    def poisoned(inputs, batch):
        calls["n"] += 1
        loss = real(inputs, batch)
        return loss * float("nan") if calls["n"] == 3 else loss

    monkeypatch.setattr("library.training.trainer.micro_batch_loss", poisoned)


def test_nan_policy_skip_drops_the_step_and_goes_on(tmp_path, tiny_model_dir, images, monkeypatch, capsys):
    clean = write_config(tmp_path / "clean.toml", tiny_model_dir, images, tmp_path / "clean", max_train_steps=4)
    assert train(clean) == 0
    _poison_third_micro_batch(monkeypatch)
    config = write_config(
        tmp_path / "c.toml", tiny_model_dir, images, tmp_path / "c", max_train_steps=4, nan_policy="skip",
        save_state_on_train_end=True,
    )
    assert train(config) == 0
    assert "1 optimizer steps were skipped" in capsys.readouterr().out
    weights = tensors(tmp_path / "c" / "run.safetensors")
    assert all(torch.isfinite(t).all() for t in weights.values())
    assert any(not torch.equal(t, tensors(tmp_path / "clean" / "run.safetensors")[k]) for k, t in weights.items())
    # the optimizer stepped 3 times out of 4
    state = torch.load(tmp_path / "c" / "run-state" / "optimizer.pt", weights_only=True)["state"]
    assert {int(v["step"]) for v in state.values()} == {3}
