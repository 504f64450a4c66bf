"""The start-up benchmark's options (bench/data_scan.py): a comparison with sd-scripts runs on a
model sd-scripts can load and times the figure it compares."""

from __future__ import annotations

import subprocess

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


def test_against_exports_that_commits_library(tmp_path):
    # the old code the rerun scan is compared with is the commit's own, not this checkout's
    from bench.data_scan import REPO, export

    head = subprocess.run(
        ["git", "-C", str(REPO), "show", "HEAD:library/data/scan_index.py"],
        capture_output=True, check=True,
    ).stdout  # fmt: skip
    tree = export("HEAD", tmp_path)
    assert (tree / "library" / "data" / "scan_index.py").read_bytes() == head
    assert parse_args(["--against", "HEAD"]).rounds == 3


def test_against_an_unknown_commit_names_it(tmp_path):
    from bench.data_scan import BenchError, export

    with pytest.raises(BenchError, match="--against no-such-ref"):
        export("no-such-ref", tmp_path)


def test_first_run_and_drop_pages_only_with_against(capsys):
    assert parse_args(["--against", "HEAD", "--first_run", "--drop_pages"]).first_run
    for option in ("--first_run", "--drop_pages"):
        with pytest.raises(SystemExit):
            parse_args([option])
        assert "--against" in capsys.readouterr().err


def test_dropping_the_pages_leaves_the_files(tmp_path):
    from bench.data_scan import drop_pages

    (tmp_path / "a.txt").write_text("caption", "utf-8")
    drop_pages(tmp_path)
    assert (tmp_path / "a.txt").read_text("utf-8") == "caption"
