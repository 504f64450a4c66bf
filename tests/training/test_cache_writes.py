"""Disk caches in a folder of their own (cache_dir, a dataset's cache_directory): a full disk
names that folder's setting, the temporaries of killed cache writes are cleared by the next run
(never one another run is writing), and the plan says where the caches are."""

from __future__ import annotations

import errno
import os
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from library.data.latent_cache import LatentCache
from library.models.conditioning import TextConditioning
from library.saving import atomic
from library.saving.atomic import SaveError
from library.training.caching import clear_killed_writes
from library.training.progress import _cache_place
from library.training.text_cache import TextEncoderCache
from tests.data.test_latent_cache import build, requests_for, write_png

HINT = "free space or choose another cache folder (cache_dir, or the dataset's cache_directory)"


@pytest.fixture
def full_disk(monkeypatch):
    def full(_fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(atomic.os, "fsync", full)


def test_a_full_disk_while_caching_latents_names_the_cache_folder(tmp_path, full_disk):
    images = [write_png(tmp_path / "imgs" / "0.png", seed=0)]
    cache_folder = tmp_path / "cache"
    with pytest.raises(SaveError) as failed:
        build(LatentCache("vae", torch.float32, to_disk=True), requests_for(images, cache_folder))
    message = str(failed.value)
    assert message.startswith(f"cannot write {cache_folder / 'latents'}{os.sep}")
    assert message.endswith(f": no space left on device; {HINT}") and "output_dir" not in message
    assert list((cache_folder / "latents").iterdir()) == []  # nothing half-written is left


def test_a_full_disk_while_caching_text_names_the_cache_folder(tmp_path, full_disk):
    def encode(captions):
        return TextConditioning(hidden=torch.zeros(len(captions), 2, 4), pooled=None)

    cache = TextEncoderCache("identity", to_disk=True)
    with pytest.raises(SaveError) as failed:
        cache.prefill(["a photo"], [tmp_path / "cache"], encode, batch_size=1)
    message = str(failed.value)
    assert message.startswith(f"cannot write {tmp_path / 'cache' / 'text'}{os.sep}")
    assert message.endswith(HINT) and "output_dir" not in message


class Accelerator:
    def __init__(self, main: bool = True):
        self.is_local_main_process = main
        self.printed: list[str] = []

    def print(self, line: str) -> None:
        self.printed.append(line)


def _data(*roots: Path, validation: Path | None = None):
    images = [SimpleNamespace(cache_root=root) for root in roots]
    held = [SimpleNamespace(cache_root=validation)] if validation else []
    return SimpleNamespace(scanned=[SimpleNamespace(images=images, validation=held)])


def _leftover(folder: Path, name: str, age_s: float = 3600) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_bytes(b"half")
    then = time.time() - age_s
    os.utime(path, (then, then))
    return path


def test_the_next_run_clears_what_killed_cache_writes_left(tmp_path):
    key = "0123456789abcdef" * 2
    shared, held = tmp_path / "shared", tmp_path / "held"
    killed = _leftover(shared / "latents", f".{key}.safetensors.x1y2z3.tmp")
    of_validation = _leftover(held / "latents", f".{key}.safetensors.a1b2c3.tmp")
    text = _leftover(shared / "text", f".{key * 2}.safetensors.q9w8e7.tmp")
    writing = _leftover(shared / "latents", f".{key}.safetensors.n0w.tmp", age_s=0)
    users = _leftover(shared / "latents", ".notes.txt.abc.tmp")
    data = _data(shared, shared, validation=held)

    assert clear_killed_writes(data, "latents", Accelerator(main=False)) == []  # one per machine
    accelerator = Accelerator()
    assert sorted(clear_killed_writes(data, "latents", accelerator)) == sorted(
        [killed, of_validation]
    )
    assert not killed.exists() and not of_validation.exists()
    assert text.exists() and writing.exists() and users.exists()
    assert accelerator.printed == [
        f"removed 2 unfinished cache file(s) that stopped runs left in "
        f"{held / 'latents'}, {shared / 'latents'}"
    ]
    assert clear_killed_writes(data, "text", accelerator) == [text]


def _config(cache_dir, *cache_directories):
    subsets = [SimpleNamespace(cache_directory=c) for c in cache_directories]
    return SimpleNamespace(
        data=SimpleNamespace(cache_dir=cache_dir),
        datasets=[SimpleNamespace(subsets=subsets)],
    )


def test_the_plan_says_where_the_disk_caches_are():
    assert _cache_place(_config(None, "/data/edit/cache"), True) == (
        "in memory and on disk (/data/edit/cache)"
    )
    # a subset of its own, one under cache_dir, one beside its images without cache_dir
    assert _cache_place(_config("/c", "/own", None), True) == "in memory and on disk (/own; /c)"
    assert _cache_place(_config(None, None), True) == (
        "in memory and on disk (.difftune_cache inside each image folder)"
    )
    assert _cache_place(_config(None, "/own"), False) == "in memory"
