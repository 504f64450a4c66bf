"""Session fixtures of the distributed tests: one image set and the shared runs."""

import pytest

from tests.distributed.suite import Runs
from tests.integration.harness import make_images


def needed_launches(item) -> list[str]:
    """The launches of ``item``'s module (its ``LAUNCHES``) that ``item`` may ask for: those
    naming its ``mode`` parameter when it has one (``-k <mode>`` starts no other mode's runs),
    else all. A run asked for without being listed here still starts, when asked for."""
    launches = list(getattr(item.module, "LAUNCHES", ()))
    callspec = getattr(item, "callspec", None)
    mode = callspec.params.get("mode") if callspec is not None else None
    if not isinstance(mode, str):
        return launches
    return [name for name in launches if f"-{mode}-" in f"-{name}-"]


@pytest.fixture(scope="session")
def runs(request, tmp_path_factory, tiny_model_dir, kit_folders):
    """The shared runs; the launches the selected tests need start now, in test order."""
    images = make_images(tmp_path_factory.mktemp("dist-data") / "imgs", 4)
    shared = Runs(tmp_path_factory.mktemp("dist-runs"), tiny_model_dir, images, kit_folders)
    needed = []
    for item in request.session.items:
        for name in needed_launches(item):
            if name not in needed:
                needed.append(name)
    shared.start(needed)
    yield shared
    shared.close()
