"""Session fixtures of the distributed tests: one image set and the shared runs."""

import pytest

from tests.distributed.suite import Runs
from tests.integration.harness import make_images


@pytest.fixture(scope="session")
def runs(request, tmp_path_factory, tiny_model_dir):
    """The shared runs; the launches the selected tests need start now, in test order."""
    images = make_images(tmp_path_factory.mktemp("dist-data") / "imgs", 4)
    shared = Runs(tmp_path_factory.mktemp("dist-runs"), tiny_model_dir, images)
    needed = []
    for item in request.session.items:
        for name in getattr(item.module, "LAUNCHES", ()):
            if name not in needed:
                needed.append(name)
    shared.start(needed)
    yield shared
    shared.close()
