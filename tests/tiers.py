"""Test tiers: every test is marked ``distributed``, ``integration``, ``subprocess`` or ``slow``
when it is one, without its author having to think of it, and every other test is marked
``fast``, so ``python -m pytest -m fast`` is the quick development loop.

Marks come from three places:

- the test's directory (``DIRECTORY_MARKS``) and the fixtures it uses (``FIXTURE_MARKS``), at
  collection;
- explicit ``@pytest.mark.<tier>`` marks, where neither can know;
- a guard that watches every test run: a test of the fast tier that starts another Python
  process (torchrun also needs ``distributed``, train_network.py also ``integration``) or runs
  the CLI (``library.cli.main``) inside pytest fails, naming the mark it needs and what it
  started. A fixture seen doing so is remembered, and every test using it must
  carry the mark too. So a new test cannot slip into the fast tier, and a test that forgot its
  mark fails in the fast tier itself.

Only the main thread is watched: launches a session fixture queues on worker threads (the
distributed runs) are covered by ``FIXTURE_MARKS``. Several processes started by
multiprocessing (``mp.spawn``) need an explicit ``distributed`` mark.
"""

from __future__ import annotations

import multiprocessing.util
import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest

# marker -> what puts a test in it (``pytest --markers`` lists them)
TIERS = {
    "distributed": "starts several training processes (torchrun, multiprocessing spawn)",
    "integration": "runs the real CLI (library.cli.main) in-process or trains end to end",
    "subprocess": "starts another Python process (the CLI as users run it, a script, torchrun)",
    "slow": "takes 10 s or more by itself on 2 CPU cores (a full-size layer, a long run)",
}
FAST = "fast"  # every test that is in none of TIERS: python -m pytest -q -m fast

# tests/<directory>/... -> marks of every test in it
DIRECTORY_MARKS = {
    "distributed": ("distributed",),
    "integration": ("integration",),
}
# fixture -> marks of every test that uses it (directly or through another fixture)
FIXTURE_MARKS = {
    # the shared torchrun launches (queued on worker threads) and in-process reference runs
    "runs": ("distributed", "integration", "subprocess"),
    # the README's quickstart command, about a minute of training in another process
    "quickstart_output": ("integration", "subprocess", "slow"),
}
# fixture -> the fixture whose users its processes are charged to: the autouse quickstart_process
# starts the run early for the tests that ask for quickstart_output (and only when one is selected)
CHARGED_TO = {"quickstart_process": "quickstart_output"}
# A child process is "another Python" when its program is a Python, one of the environment's
# console scripts (accelerate, torchrun: next to the interpreter) or a shell script (which starts
# them); other programs (git, the wandb service) start in milliseconds and need no tier.
SHELLS = {"bash", "sh"}
DISTRIBUTED_LAUNCHERS = {"torch.distributed.run", "torchrun"}  # a program or a module (-m)
CLI_SCRIPTS = {"train_network.py"}  # a child running one is the real CLI: integration too


def tier_marks(item: pytest.Item, rootpath: Path) -> set[str]:
    """The tier marks collection gives ``item`` from its directory and fixtures."""
    try:
        folders = item.path.relative_to(rootpath).parts[:-1]
    except ValueError:
        folders = ()
    marks = {mark for folder in folders for mark in DIRECTORY_MARKS.get(folder, ())}
    for fixture in getattr(item, "fixturenames", ()):
        marks.update(FIXTURE_MARKS.get(fixture, ()))
    return marks


def _starts_python(program: str) -> bool:
    path = Path(shutil.which(program) or program)
    scripts = Path(os.path.abspath(sys.executable)).parent
    return (
        path.name.startswith("python")
        or path.name in SHELLS
        or Path(os.path.abspath(path)).parent == scripts
    )


def _process_kinds(args) -> tuple[set[str], str]:
    """(the tiers a child process started with ``args`` needs, its command line in brief)."""
    argv = [os.fspath(args)] if isinstance(args, (str, bytes, os.PathLike)) else list(args)
    argv = [a.decode() if isinstance(a, bytes) else os.fspath(a) for a in argv]
    command = " ".join(argv)
    if not argv or not _starts_python(command.split()[0]):
        return set(), command
    names = {Path(arg).name for arg in argv}  # not the text of a -c program
    kinds = {"subprocess"}
    if names & DISTRIBUTED_LAUNCHERS:
        kinds.add("distributed")
    if names & CLI_SCRIPTS:
        kinds.add("integration")
    return kinds, command[:160]


def _fixture_key(fixturedef) -> tuple[str, str]:
    # Fixtures are told apart by where they are defined: two modules may each have "images".
    return fixturedef.baseid, fixturedef.argname


def _used_fixtures(item: pytest.Item) -> list[tuple[str, str]]:
    """The keys of the fixtures ``item`` uses, directly or through other fixtures."""
    defs = getattr(getattr(item, "_fixtureinfo", None), "name2fixturedefs", {})
    return [_fixture_key(chain[-1]) for chain in defs.values() if chain]


class Guard:
    """What the running test (or the fixture being set up) started, and which fixtures are
    known to start processes."""

    def __init__(self):
        self.fixtures: list[tuple[str, str]] = []  # being set up, innermost last
        self.seen: dict[str, str] = {}  # tier -> an example of what needed it, for this test
        self.fixture_needs: dict[tuple[str, str], dict[str, str]] = {}

    def record(self, kinds: set[str], what: str) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        if self.fixtures:
            baseid, name = self.fixtures[-1]
            needs = self.fixture_needs.setdefault((baseid, CHARGED_TO.get(name, name)), {})
        else:
            needs = self.seen
        for kind in kinds:
            needs.setdefault(kind, what)

    def missing(self, item: pytest.Item) -> list[str]:
        """One line per tier a fast-tier test needs (none for a test already out of the fast
        tier: the rule keeps the fast tier fast, it does not ask for every fitting mark)."""
        if any(item.get_closest_marker(tier) for tier in TIERS):
            return []
        needs = {kind: (what, None) for kind, what in self.seen.items()}
        for key in _used_fixtures(item):
            for kind, what in self.fixture_needs.get(key, {}).items():
                needs.setdefault(kind, (what, key[1]))
        lines = []
        for kind, (what, fixture) in sorted(needs.items()):
            if item.get_closest_marker(kind) is None:
                through = f" (in its fixture {fixture!r})" if fixture else ""
                lines.append(f"@pytest.mark.{kind}: it {what}{through}")
        return lines


# Guards of the pytest sessions in this process, innermost last (a test may run pytest inside
# pytest); the patches below are installed once and report to the innermost.
_guards: list[Guard] = []
_originals: dict[str, object] = {}
_guard_key = pytest.StashKey[Guard]()  # the guard of a session, in its config


def _report(kinds: set[str], what: str) -> None:
    if _guards and kinds:
        _guards[-1].record(kinds, what)


def _install_patches() -> None:
    import library.cli  # light: it imports the heavy parts only when called

    popen_init = subprocess.Popen.__init__
    spawn = multiprocessing.util.spawnv_passfds
    cli_main = library.cli.main

    def watched_popen_init(self, args, *rest, **kwargs):
        kinds, command = _process_kinds(args)
        _report(kinds, f"started a process: {command}")
        popen_init(self, args, *rest, **kwargs)

    def watched_spawn(path, args, passfds):
        _report({"subprocess"}, f"started a process: {' '.join(map(str, args))[:160]}")
        return spawn(path, args, passfds)

    def watched_main(argv=None):
        _report({"integration"}, f"ran the CLI in-process: main({argv!r})"[:200])
        return cli_main(argv)

    _originals.update(popen=popen_init, spawn=spawn, main=cli_main)
    subprocess.Popen.__init__ = watched_popen_init
    multiprocessing.util.spawnv_passfds = watched_spawn
    library.cli.main = watched_main


def _remove_patches() -> None:
    import library.cli

    subprocess.Popen.__init__ = _originals.pop("popen")
    multiprocessing.util.spawnv_passfds = _originals.pop("spawn")
    library.cli.main = _originals.pop("main")


def pytest_configure(config: pytest.Config) -> None:
    for name, meaning in {**TIERS, FAST: "in none of the tiers above (the development loop)"}.items():
        config.addinivalue_line("markers", f"{name}: {meaning}")
    if not _guards:
        _install_patches()
    _guards.append(Guard())
    config.stash[_guard_key] = _guards[-1]


def pytest_unconfigure(config: pytest.Config) -> None:
    guard = config.stash.get(_guard_key, None)
    if guard is not None and guard in _guards:
        _guards.remove(guard)
        if not _guards:
            _remove_patches()


@pytest.hookimpl(tryfirst=True)  # before -m deselects by marker
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        for mark in sorted(tier_marks(item, config.rootpath)):
            item.add_marker(mark)
        if not any(item.get_closest_marker(tier) for tier in TIERS):
            item.add_marker(FAST)


@pytest.hookimpl(wrapper=True)
def pytest_fixture_setup(fixturedef, request):
    guard = request.config.stash.get(_guard_key, None)
    if guard is None:
        return (yield)
    guard.fixtures.append(_fixture_key(fixturedef))
    try:
        return (yield)
    finally:
        guard.fixtures.pop()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item):
    guard = item.config.stash.get(_guard_key, None)
    if guard is None:
        return (yield)
    guard.seen = {}
    result = yield  # a failing test fails as it is; a passing one must carry its tiers
    missing = guard.missing(item)
    if missing:
        pytest.fail(
            "this test needs the mark(s) below (tests/tiers.py: the fast tier must not start "
            "processes or run the CLI):\n  " + "\n  ".join(missing),
            pytrace=False,
        )
    return result
