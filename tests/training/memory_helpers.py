"""What the memory-estimate tests share: one training size, data statistics at it, a config
written from keys, the training parts a config sets up, and the peak memory torch's profiler
measures."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import torch
from torch.profiler import ProfilerActivity, profile

from library.config.loader import load_config
from library.models.loader import load_components
from library.training.meta_activations import TrainingSize
from library.training.setup import WEIGHT_DTYPES, setup_training

SIZE = TrainingSize(64, 64, 2)


def size_stats():
    """Data statistics of one dataset of SIZE's images, batched at its batch size."""
    dataset = SimpleNamespace(buckets=[], resolution=(SIZE.width, SIZE.height),
                              batch_size=SIZE.batch)  # fmt: skip
    return SimpleNamespace(datasets=[dataset])


def write_config(tmp_path: Path, keys: dict):
    """The config of ``keys`` (flat kohya keys) with one dataset, loaded from a file."""
    lines = [f"{k} = {json.dumps(v)}" for k, v in keys.items()]
    lines += ["[[datasets]]", "[[datasets.subsets]]", 'image_dir = "unused"']
    path = tmp_path / "c.toml"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return load_config(str(path))


def training_parts(config):
    """The loaded, adapted models ``config`` trains, at its mixed-precision dtype."""
    dtype = WEIGHT_DTYPES[config.training.mixed_precision]
    torch.manual_seed(0)
    return setup_training(config, load_components(config.model, dtype, config.flow))


def profiled_peak(run) -> int:
    """The most bytes allocated at once while ``run()`` runs on the CPU, from torch's profiler."""
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        run()
    events = [e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"]
    live = peak = 0
    for event in sorted(events, key=lambda e: e.start_ns()):
        live += event.nbytes()
        peak = max(peak, live)
    return peak
