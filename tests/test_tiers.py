"""The test tiers (tests/tiers.py): directory and fixture marks, the fast tier, and the guard that
fails a test which starts a process or runs the CLI without its mark. Each check runs a small
pytest session inside this one (pytester) with the tiers plugin."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

# pytester's in-process runs put sys.modules back as they found it; torch imported first inside
# one of them would be dropped there and imported a second time by the last test, which
# crashes torch's C extension. Importing it here keeps it in every snapshot.
import torch

REPO = Path(__file__).resolve().parents[1]
PYTHON_CHILD = "subprocess.run([sys.executable, '-c', 'pass'], check=True)"


def _run(pytester: pytest.Pytester, *args: str) -> pytest.RunResult:
    # importlib mode: the inner tests' module names cannot clash with this session's
    # (tests/integration is a package here)
    return pytester.runpytest_inprocess(
        "-p", "tests.tiers", "-p", "no:cacheprovider", "--import-mode=importlib", *args
    )


def test_directory_and_fixture_marks_leave_the_fast_tier(pytester):
    pytester.makeconftest(
        """
        import pytest

        @pytest.fixture
        def runs():  # the distributed tests' shared runs, by name
            return None
        """
    )
    for folder in ("integration", "distributed", "units"):
        pytester.mkdir(folder)
    pytester.path.joinpath("integration", "test_tier_cli.py").write_text("def test_cli(): pass\n")
    pytester.path.joinpath("distributed", "test_tier_ddp.py").write_text("def test_ddp(): pass\n")
    pytester.path.joinpath("units", "test_tier_units.py").write_text(
        "import pytest\n"
        "def test_unit(): pass\n"
        "def test_uses_runs(runs): pass\n"
        "@pytest.mark.slow\n"
        "def test_slow(): pass\n"
    )
    fast = _run(pytester, "-m", "fast", "-v")
    fast.assert_outcomes(passed=1, deselected=4)
    fast.stdout.fnmatch_lines(["*units/test_tier_units.py::test_unit PASSED*"])

    for expression, selected in [
        ("integration", ["test_cli", "test_uses_runs"]),
        ("distributed", ["test_ddp", "test_uses_runs"]),
        ("subprocess", ["test_uses_runs"]),
        ("slow", ["test_slow"]),
    ]:
        result = _run(pytester, "-m", expression, "--collect-only", "-q")
        names = sorted(line.rsplit("::", 1)[1] for line in result.outlines if "::" in line)
        assert names == sorted(selected), (expression, result.outlines)


def test_a_test_that_starts_a_python_process_needs_the_subprocess_mark(pytester):
    pytester.makepyfile(
        f"""
        import shutil, subprocess, sys
        import pytest

        def test_unmarked():
            {PYTHON_CHILD}

        @pytest.mark.subprocess
        def test_marked():
            {PYTHON_CHILD}

        def test_torchrun_unmarked():
            subprocess.run([sys.executable, "-c", "pass", "-m", "torch.distributed.run"], check=True)

        def test_other_programs_need_no_tier():
            for program in ("git", "true"):  # no Python: they start in milliseconds
                if shutil.which(program):
                    subprocess.run([program, "--version"], capture_output=True)
        """
    )
    result = _run(pytester)
    result.assert_outcomes(passed=2, failed=2)
    result.stdout.fnmatch_lines(
        [
            "*_ test_unmarked _*",
            "*@pytest.mark.subprocess: it started a process: *python* -c pass",
            "*_ test_torchrun_unmarked _*",
            "*@pytest.mark.distributed: it started a process: *torch.distributed.run",
            "*@pytest.mark.subprocess: it started a process: *torch.distributed.run",
        ]
    )


def test_the_cli_in_process_needs_the_integration_mark(pytester, tmp_path):
    missing = tmp_path / "missing.toml"
    pytester.makepyfile(
        f"""
        import pytest
        from library.cli import main

        def test_unmarked():
            assert main(["--config", {str(missing)!r}]) == 2

        @pytest.mark.integration
        def test_marked():
            assert main(["--config", {str(missing)!r}]) == 2
        """
    )
    result = _run(pytester)
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(
        ["*_ test_unmarked _*", "*@pytest.mark.integration: it ran the CLI in-process: main(*"]
    )


def test_a_fixture_that_starts_a_process_needs_the_mark_on_every_test_using_it(pytester):
    pytester.makepyfile(
        test_a=f"""
        import subprocess, sys
        import pytest

        @pytest.fixture(scope="module")
        def child():
            {PYTHON_CHILD}

        @pytest.mark.subprocess
        def test_first(child):
            pass

        def test_second_unmarked(child):
            pass
        """,
        test_b="""
        import pytest

        @pytest.fixture(scope="module")
        def child():  # the same name, elsewhere, starting nothing
            pass

        def test_other_child(child):
            pass
        """,
    )
    result = _run(pytester)
    result.assert_outcomes(passed=2, failed=1)
    result.stdout.fnmatch_lines(
        [
            "*_ test_second_unmarked _*",
            "*@pytest.mark.subprocess: it started a process*(in its fixture 'child')",
        ]
    )


def test_a_failing_test_keeps_its_own_failure(pytester):
    pytester.makepyfile(
        f"""
        import subprocess, sys

        def test_fails():
            {PYTHON_CHILD}
            assert 1 == 2, "its own failure"
        """
    )
    result = _run(pytester)
    result.assert_outcomes(failed=1)
    assert "its own failure" in result.stdout.str()
    assert "needs the mark" not in result.stdout.str()


@pytest.mark.subprocess
def test_the_fast_tier_does_not_start_the_quickstart_run(tmp_path):
    """The README's quickstart run starts in the background when a selected test needs it;
    under -m fast its tests are deselected and it must not start (its folder never appears)."""
    basetemp = tmp_path / "basetemp"
    bin_dir = str(Path(sys.executable).parent)  # where the run's `accelerate` would come from
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PATH": bin_dir + os.pathsep + os.environ["PATH"]}
    one_fast_test = "tests/test_tiers.py::test_a_failing_test_keeps_its_own_failure"
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-m", "fast", f"--basetemp={basetemp}",
         "tests/integration/test_quickstart.py", "tests/integration/test_learning_demo.py",
         one_fast_test],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "1 passed" in done.stdout and "deselected" in done.stdout, done.stdout
    assert basetemp.is_dir() and not (basetemp / "quickstart-output").exists()


def test_tests_compute_on_one_thread_unless_told_otherwise():
    # tests/conftest.py sets OMP_NUM_THREADS=1 before torch is imported, unless it was set
    assert torch.get_num_threads() == int(os.environ.get("OMP_NUM_THREADS", "1"))
