"""What a training process holds on its device beyond the tensors the memory estimate counts.

The estimate (memory_estimate.py) counts tensors. A process holds more, and the more is what an
out-of-memory kill or a CUDA out-of-memory error sees:

- on the CPU, the interpreter and the libraries the trainer imports (PyTorch, diffusers,
  transformers: about half a gigabyte resident before any model loads), and the memory glibc's
  allocator keeps after a step frees it. library/host_allocator.py keeps freed memory in the
  process on purpose, so the next step does not fault every page in again; the step's
  activations are freed and allocated again in another order each step, so the heap's pages
  stay resident over more than the live tensors: measured as a share of the step's transient
  memory (bench/memory_accuracy.py, docs/performance.md);
- on CUDA, the CUDA context (the driver's state and the kernels loaded into it: about 300 to
  450 MiB under lazy module loading, PyTorch's default, more as cuBLAS and cuDNN load theirs),
  and what PyTorch's caching allocator reserves beyond the tensors alive at its peak. The
  context is counted (an assumption from PyTorch's published figures); the caching allocator's
  share is not, until ``bench/memory_accuracy.py --device cuda`` measures it on a GPU: a guess
  would refuse runs that fit (a Qwen-Image LoRA on a 24 GB card is within a gigabyte of it).
"""

from __future__ import annotations

GIB = 1024**3

# The resident set of a process that has imported what the trainer imports, before any model
# loads: 0.52 GiB measured (torch 2.13 CPU build, diffusers 0.42, transformers 5), 0.54 GiB in a
# training run's first moments.
INTERPRETER_BYTES = int(0.55 * GIB)
# The CUDA context with PyTorch's kernels loaded lazily (PyTorch's own measurements: 287 MiB
# for one tensor op, about 400 MiB in use), plus the kernels a training step loads.
CUDA_CONTEXT_BYTES = int(0.5 * GIB)
# What the allocator keeps beyond the live tensors at the peak, per byte of the step's transient
# memory (its activations, or the optimizer update's temporaries, or the VAE encoding's
# intermediates): glibc with host_allocator's settings, measured on full-size SD 1.5 runs (0.8
# to 1.1; docs/performance.md). PyTorch's CUDA caching allocator: not measured, not counted.
KEPT_PER_TRANSIENT_BYTE = {"cpu": 1.0, "cuda": 0.0}


def process_bytes(device_type: str, transient: int) -> int:
    """What a training process holds on a device of ``device_type`` beyond its tensors, when
    the most transient memory (allocated and freed within a step or an encoding) alive at once
    is ``transient`` bytes: the interpreter and libraries (CPU) or the CUDA context, plus the
    allocator's kept memory. 0 for other devices (not measured)."""
    if device_type == "cpu":
        fixed = INTERPRETER_BYTES
    elif device_type == "cuda":
        fixed = CUDA_CONTEXT_BYTES
    else:
        return 0
    return fixed + round(KEPT_PER_TRANSIENT_BYTE[device_type] * transient)
