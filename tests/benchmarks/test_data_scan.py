"""The start-up benchmark's options (bench/data_scan.py): a comparison with sd-scripts runs on a
model sd-scripts can load and times the figure it compares."""

from __future__ import annotations

import pytest

from bench.data_scan import parse_args


@pytest.fixture
def kohya(tmp_path):
    (tmp_path / "train_network.py").write_text("", "utf-8")
    return str(tmp_path)


def test_without_sd_scripts_the_tiny_model_and_no_training():
    args = parse_args([])
    assert (args.model, args.first_step) == ("tiny-sd1", False)


def test_sd_scripts_gets_the_full_size_model_and_the_first_step(kohya):
    # sd-scripts builds its UNet at SD 1.5's released shapes and is timed to its first step
    args = parse_args(["--sd_scripts", kohya])
    assert (args.model, args.first_step) == ("sd15", True)


def test_sd_scripts_with_the_tiny_model_written_is_refused(kohya, capsys):
    with pytest.raises(SystemExit):
        parse_args(["--sd_scripts", kohya, "--model", "tiny-sd1"])
    assert "--model sd15" in capsys.readouterr().err
