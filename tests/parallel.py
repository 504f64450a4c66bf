"""Running the suite on several workers (pytest-xdist: ``python -m pytest -q -n 2``).

Each worker is a pytest session of its own, so a session fixture runs once per worker. That is
only time for the fixtures that write tiny models, but the shared distributed runs (``runs``)
and the quickstart run (``quickstart_output``) start training processes, which must not start
twice. So, under ``-n`` (``--dist loadfile``, chosen here when ``-n`` comes without a
``--dist``), ``FileGroupScheduling`` hands the workers:

- the tests using such a fixture (``GROUPS``), wherever they are, as one unit of work: they run
  on one worker, which starts the fixture's processes once;
- every other test with the others of its file: a file's module fixtures (the tiny pipelines a
  conformance file reads once) are built on one worker, not on each.

xdist orders the units by their number of tests, so the distributed runs start at once on one
worker while the other takes the files. The workers find each test's group at collection and
write it to a file the scheduler reads (xdist's own ``xdist_group`` marks travel in the node
ids, which pytest 9.2 no longer lets a plugin change: pytest-xdist issue 1386).

Without ``-n`` (or without pytest-xdist) nothing here changes the run: the suite stays serial.
Each worker computes on one thread (OMP_NUM_THREADS, tests/conftest.py), like the serial run.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

import pytest

# fixture -> the unit of work of every test using it (directly or through another fixture)
GROUPS = {
    "runs": "distributed-runs",  # the torchrun launches queued for the whole session
    "quickstart_output": "quickstart",  # the README's quickstart run, a minute of training
}
LOADFILE = "loadfile"
_GROUPS_FILE = "difftune_groups_file"  # workerinput key: where workers write {nodeid: group}
_groups_file = pytest.StashKey[str]()  # the controller's path of that file


def is_worker() -> bool:
    """Whether this process is an xdist worker (each runs its own session of fixtures)."""
    return "PYTEST_XDIST_WORKER" in os.environ


def group_of(item: pytest.Item) -> str | None:
    """The unit of work ``item`` joins through its fixtures, if any."""
    names = sorted({GROUPS[name] for name in getattr(item, "fixturenames", ()) if name in GROUPS})
    return "+".join(names) or None


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist's own, which would choose "load" for -n
def pytest_cmdline_main(config: pytest.Config) -> None:
    if getattr(config.option, "numprocesses", None) and config.option.dist == "no":
        config.option.dist = LOADFILE


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node) -> None:
    config = node.config
    if config.option.dist == LOADFILE:
        if _groups_file not in config.stash:
            handle, config.stash[_groups_file] = tempfile.mkstemp(prefix="pytest-groups-")
            os.close(handle)
        node.workerinput[_GROUPS_FILE] = config.stash[_groups_file]


def pytest_unconfigure(config: pytest.Config) -> None:
    path = config.stash.get(_groups_file, None)
    if path is not None:
        Path(path).unlink(missing_ok=True)


@pytest.hookimpl(trylast=True)  # the selection as it will run (after -m and -k)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    path = getattr(config, "workerinput", {}).get(_GROUPS_FILE)
    if path is None:
        return
    groups = {item.nodeid: group for item in items if (group := group_of(item))}
    # every worker collects the same tests and writes the same map, each whole (os.replace)
    part = f"{path}.{os.environ.get('PYTEST_XDIST_WORKER', 'worker')}"
    Path(part).write_text(json.dumps(groups), encoding="utf-8")
    os.replace(part, path)


@pytest.hookimpl(tryfirst=True, optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log):
    if config.getvalue("dist") != LOADFILE:
        return None
    from xdist.scheduler import LoadFileScheduling

    class FileGroupScheduling(LoadFileScheduling):
        """loadfile, with the tests of each group (GROUPS) as one unit of work."""

        groups: dict[str, str] = {}

        def schedule(self) -> None:
            # every worker has collected (and written the groups) before the first schedule
            if not self.groups and _groups_file in config.stash:
                text = Path(config.stash[_groups_file]).read_text(encoding="utf-8")
                self.groups = json.loads(text or "{}")
            super().schedule()

        def _split_scope(self, nodeid: str) -> str:
            return self.groups.get(nodeid) or super()._split_scope(nodeid)

    return FileGroupScheduling(config, log)
