"""The command line as a user runs it: exit codes, one-line errors, --dry_run, --print_config."""

import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from tests.integration.harness import make_images, write_config

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.subprocess  # every test runs train_network.py as users do (run_cli)


def run_cli(*args, cwd=REPO):
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    return subprocess.run(
        [sys.executable, str(REPO / "train_network.py"), *map(str, args)],
        cwd=cwd, env=env, capture_output=True, text=True, timeout=300,
    )


@pytest.fixture(scope="module")
def setup(tmp_path_factory, tiny_model_dir):
    root = tmp_path_factory.mktemp("cli")
    images = make_images(root / "imgs", 3)
    return root, images, tiny_model_dir


def _assert_one_line_error(result, *needles):
    assert result.returncode == 2, result.stderr
    lines = [line for line in result.stderr.strip().splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    assert "Traceback" not in result.stderr
    for needle in needles:
        assert needle in lines[0]


def test_unknown_key_is_one_line_with_suggestion(setup, tmp_path):
    root, images, model = setup
    config = write_config(tmp_path / "c.toml", model, images, tmp_path / "o", learning_rat=1e-4)
    _assert_one_line_error(run_cli("--config", config), str(config), "learning_rat", "learning_rate")


def test_wrong_type_names_key_value_and_allowed(setup, tmp_path):
    root, images, model = setup
    config = write_config(tmp_path / "c.toml", model, images, tmp_path / "o", network_dim="big")
    _assert_one_line_error(run_cli("--config", config), "network_dim", "big")


def test_missing_model_folder(setup, tmp_path):
    root, images, _ = setup
    config = write_config(tmp_path / "c.toml", tmp_path / "nope", images, tmp_path / "o", max_train_steps=1)
    _assert_one_line_error(run_cli("--config", config), str(tmp_path / "nope"))


def test_unsupported_kohya_key_is_named(setup, tmp_path):
    root, images, model = setup
    config = write_config(tmp_path / "c.toml", model, images, tmp_path / "o", torch_compile=True)
    _assert_one_line_error(run_cli("--config", config), "torch_compile", "not supported")


def test_dry_run_prints_the_plan_and_trains_nothing(setup, tmp_path):
    root, images, model = setup
    config = write_config(
        tmp_path / "c.toml", model, images, tmp_path / "o",
        train_batch_size=2, gradient_accumulation_steps=2, max_train_epochs=3, save_every_n_steps=2,
    )
    result = run_cli("--config", config, "--dry_run")
    assert result.returncode == 0, result.stderr
    out = result.stdout
    # 3 images x 1 repeat, effective batch 4 -> 1 step per epoch with 1 padded sample; 3 epochs
    assert "optimizer steps per epoch: 1" in out
    assert "total optimizer steps: 3 (3 epochs)" in out
    assert "effective batch per optimizer step: 4" in out
    assert "1 padding slots" in out
    assert "every 2 steps" in out
    assert not (tmp_path / "o").exists()


def test_print_config_round_trips(setup, tmp_path):
    root, images, model = setup
    config = write_config(tmp_path / "c.toml", model, images, tmp_path / "o", max_train_steps=9)
    result = run_cli("--config", config, "--print_config", "--learning_rate", "3e-4")
    assert result.returncode == 0, result.stderr
    assert re.search(r"^learning_rate = 0\.0003 +# command line$", result.stdout, re.M)
    again = tmp_path / "resolved.toml"
    again.write_text(result.stdout)
    second = run_cli("--config", again, "--print_config")
    assert second.returncode == 0, second.stderr
    # the same config; only the marks saying where each value came from differ
    assert tomllib.loads(second.stdout) == tomllib.loads(result.stdout)
    assert re.search(rf"^learning_rate = 0\.0003 +# {re.escape(str(again))}$", second.stdout, re.M)


def test_existing_output_is_refused(setup, tmp_path):
    root, images, model = setup
    out = tmp_path / "o"
    out.mkdir()
    (out / "run.safetensors").write_bytes(b"earlier run")
    config = write_config(tmp_path / "c.toml", model, images, out, max_train_steps=1)
    _assert_one_line_error(run_cli("--config", config), "already exists", "overwrite")
    assert (out / "run.safetensors").read_bytes() == b"earlier run"
