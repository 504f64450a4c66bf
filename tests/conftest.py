"""Shared fixtures: tiny SD models written to temporary diffusers folders, offline."""

from __future__ import annotations

import os

import pytest

# tests/tiers.py: the tier markers, assigned and checked; pytester runs pytest inside a test
# tests/parallel.py: what -n (pytest-xdist) needs to run the suite on several workers
pytest_plugins = ["pytester", "tests.tiers", "tests.parallel"]

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("DIFFUSERS_VERBOSITY", "error")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
# One compute thread, read when torch is first imported (after this file): the tiny models gain
# nothing from a second one, and beside the background runs (quickstart, torchrun launches) or
# other work on 2 cores the threads only wait for each other. The fast tier took 4x the CPU time
# with torch's default (tests/sampling: 24 s of CPU against 128 s). Set it to choose another.
os.environ.setdefault("OMP_NUM_THREADS", "1")


@pytest.fixture(scope="session")
def tiny_model_dir(kit_folders):
    """A tiny SD 1.x model in diffusers folder format (epsilon prediction): the SD kit's folder,
    the one the conformance and distributed suites read too."""
    return kit_folders("sd", "sd1")


@pytest.fixture(scope="session")
def tiny_sd2v_model_dir(tmp_path_factory):
    """A tiny SD 2.x 768-v style model (linear projections, v-prediction)."""
    from tests.kits.sd.tiny import save_tiny_model

    return save_tiny_model(tmp_path_factory.mktemp("models") / "tiny-sd2v", family="sd2-v")


@pytest.fixture(scope="session")
def tiny_sdxl_model_dir(kit_folders):
    """A tiny SDXL model (two text encoders, size conditioning) in diffusers folder format: the
    SD kit's folder."""
    return kit_folders("sd", "sdxl")


@pytest.fixture(scope="session")
def kit_folders(tmp_path_factory):
    """(family, variant) -> the kit's tiny diffusers folder (seed 0), written once per session
    and read by every test that needs it (tests.kits.KitFolders): read it, never write into it."""
    from tests.kits import KitFolders

    return KitFolders(tmp_path_factory.mktemp("kit-folders"))


@pytest.fixture(scope="session", autouse=True)
def quickstart_process(request, tmp_path_factory):
    """When the session runs a test of the README's quickstart run (about a minute of
    training), that run starts at once, beside the other tests, instead of when its first test
    asks for it (quickstart_output). None when no selected test needs it, and in an xdist
    worker, which holds every selected test but runs only those it is sent (the worker that
    gets the quickstart's group starts the run when its first test asks for it)."""
    from tests.parallel import is_worker

    items = request.session.items
    if is_worker() or not any("quickstart_output" in getattr(i, "fixturenames", ()) for i in items):
        yield None
        return
    from tests.integration.test_quickstart import start_quickstart

    proc = start_quickstart(tmp_path_factory)
    yield proc
    if proc.poll() is None:  # the session ended (-x, Ctrl-C) before a test waited for it
        proc.kill()
        proc.wait()


@pytest.fixture(scope="session")
def quickstart_output(quickstart_process, tmp_path_factory):
    """The quickstart run's output folder, once the run has finished."""
    from tests.integration.test_quickstart import finish_quickstart, start_quickstart

    proc = quickstart_process or start_quickstart(tmp_path_factory)
    return finish_quickstart(proc, tmp_path_factory)
