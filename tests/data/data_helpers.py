"""Helpers for the data tests: tiny images written with PIL."""

from __future__ import annotations

import subprocess
from pathlib import Path

from PIL import Image


def write_image(path: Path, color=(0, 0, 0), size=(16, 16), mode="RGB") -> Path:
    """A solid-color image file (the format follows the suffix)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new(mode, size, color).save(path)
    return path


def index_color(i: int) -> tuple[int, int, int]:
    """A distinct, exactly representable color for image number i (< 50)."""
    return (5 * i, 250 - 5 * i, (37 * i) % 256)


def bucketed_config(folder: Path, **subset_keys):
    """A dataset of one subset ``folder`` at resolution 128 with buckets from 64 to 256 in
    steps of 64 (what the scan tests use)."""
    from library.config.dataset_schema import DatasetConfig, SubsetConfig

    subset = SubsetConfig(image_dir=str(folder), **subset_keys)
    return DatasetConfig(
        resolution=128,
        enable_bucket=True,
        min_bucket_reso=64,
        max_bucket_reso=256,
        bucket_reso_steps=64,
        subsets=[subset],
    )


def count_paths(monkeypatch) -> list:
    """A list that gets an entry for every path object made from now on (constructed or
    joined with "/"), for checks that a scan makes none per image."""
    import pathlib

    made: list = []
    for cls, name in ((pathlib.PurePath, "__new__"), (pathlib.Path, "__new__"),
                      (pathlib.PurePath, "__truediv__")):  # fmt: skip
        real = cls.__dict__[name]

        def counting(*args, real=real, **kwargs):
            made.append(args[1:])
            return real(*args, **kwargs)

        monkeypatch.setattr(cls, name, counting)
    return made


def started_processes(monkeypatch) -> list:
    """Lists the command of each process started from now on (subprocess.Popen counted)."""
    started = []
    popen = subprocess.Popen

    def counting(*args, **kwargs):
        started.append(args[0])
        return popen(*args, **kwargs)

    monkeypatch.setattr(subprocess, "Popen", counting)
    return started
