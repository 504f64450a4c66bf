"""bench/memory_accuracy.py measures what the process holds: on the CPU the step's peak
resident set, on CUDA the reserved peak plus the CUDA context; the tensors' own peak beside."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from bench.memory_accuracy import measured_peak, run_environment
from bench.train_speed import BenchError

GIB = 2**30


def _cpu_steps():
    return [
        {"cpu_seconds": 10.0, "minor_faults": 1000},  # the first step: no reset before it
        {"cpu_seconds": 12.0, "minor_faults": 1500, "step_peak_rss_bytes": 7 * GIB,
         "step_peak_bytes": 5 * GIB},
        {"cpu_seconds": 15.0, "minor_faults": 1600, "step_peak_rss_bytes": 8 * GIB,
         "step_peak_bytes": 4 * GIB},
    ]  # fmt: skip


def test_the_cpu_figure_is_the_resident_peak():
    peaks = measured_peak(_cpu_steps(), "cpu")
    assert peaks.process == 8 * GIB and peaks.tensors == 5 * GIB
    # the steps after the first: 2 and 3 CPU seconds, 500 and 100 faults
    assert peaks.cpu_seconds == 2.5 and peaks.faults == 300


def test_the_cuda_figure_is_reserved_plus_the_context():
    steps = [
        {"cpu_seconds": 1.0, "minor_faults": 0},
        {"cpu_seconds": 2.0, "minor_faults": 0, "cuda_step_peak_allocated_bytes": 5 * GIB,
         "cuda_step_peak_reserved_bytes": 6 * GIB, "cuda_context_bytes": GIB // 2},
        {"cpu_seconds": 3.0, "minor_faults": 0, "cuda_step_peak_allocated_bytes": 4 * GIB,
         "cuda_step_peak_reserved_bytes": 7 * GIB, "cuda_context_bytes": GIB // 2},
    ]  # fmt: skip
    peaks = measured_peak(steps, "cuda")
    assert peaks.process == 7 * GIB + GIB // 2 and peaks.tensors == 5 * GIB


def test_no_step_peak_is_an_error():
    with pytest.raises(BenchError, match="raise --steps"):
        measured_peak(_cpu_steps()[:1], "cpu")


def test_runs_are_plain_unless_asked():
    assert run_environment(SimpleNamespace(env=[], tensors=False)) == {}
    tensors = run_environment(SimpleNamespace(env=["A=1=2"], tensors=True))
    assert tensors == {"A": "1=2", "MALLOC_MMAP_THRESHOLD_": str(64 * 1024)}
