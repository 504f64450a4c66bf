"""The suite on two xdist workers (tests/parallel.py): the fixtures that start training
processes run once, a file's tests share one worker, and the tier guard still watches every
test. A small pytest session runs under ``-n 2`` in another process and logs which worker set
up what."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

CONFTEST = """
import os
import pytest

pytest_plugins = ["tests.tiers", "tests.parallel"]


def log(what):
    with open(os.environ["PARALLEL_LOG"], "a") as file:
        file.write(f"{what} {os.environ.get('PYTEST_XDIST_WORKER', 'main')}\\n")


@pytest.fixture(scope="session")
def runs():  # the distributed tests' shared launches, by name
    log("runs")


@pytest.fixture(scope="session")
def quickstart_output():  # the quickstart run, by name
    log("quickstart")
"""

FILE_WITH_MODULE_FIXTURE = """
import pytest
from conftest import log


@pytest.fixture(scope="module")
def pipeline(request):
    log("module " + request.module.__name__)


@pytest.mark.parametrize("i", range(4))
def test_reads(pipeline, i):
    log("test " + __name__)
"""


@pytest.mark.subprocess
def test_two_workers_start_each_shared_run_once_and_keep_files_together(pytester, monkeypatch):
    pytest.importorskip("xdist")
    log = pytester.path / "log.txt"
    monkeypatch.setenv("PARALLEL_LOG", str(log))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    pytester.makeconftest(CONFTEST)
    files = {f"test_reads{i}": FILE_WITH_MODULE_FIXTURE for i in range(4)}
    for i in range(3):  # the users of each shared run, spread over files
        files[f"test_runs{i}"] = "def test_a(runs): pass\ndef test_b(runs): pass\n"
        files[f"test_quick{i}"] = "def test_a(quickstart_output): pass\n"
    files["test_guard"] = (
        "import subprocess, sys\n"
        "def test_unmarked():\n"
        "    subprocess.run([sys.executable, '-c', 'pass'], check=True)\n"
    )
    pytester.makepyfile(**files)

    result = pytester.runpytest_subprocess("-n", "2", "-p", "no:cacheprovider")

    result.assert_outcomes(passed=4 * 4 + 3 * 2 + 3, failed=1)
    result.stdout.fnmatch_lines(["*@pytest.mark.subprocess: it started a process: *python* -c*"])
    lines = [line.split() for line in log.read_text().splitlines()]
    setups = [" ".join(words[:-1]) for words in lines if words[0] != "test"]
    assert sorted(setups) == sorted(
        ["runs", "quickstart"] + [f"module test_reads{i}" for i in range(4)]
    ), "each shared run and each module fixture set up once"
    workers_of = {}
    for *what, worker in lines:
        if what[0] == "test":
            workers_of.setdefault(what[1], set()).add(worker)
    assert all(len(workers) == 1 for workers in workers_of.values()), workers_of
    assert {worker for *_, worker in lines} == {"gw0", "gw1"}, "both workers worked"
