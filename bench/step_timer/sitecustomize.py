"""The benchmark's step timer, loaded into every Python process that bench/train_speed.py starts.

bench/train_speed.py puts this folder first on PYTHONPATH and sets ``DIFFTUNE_STEP_TIMER`` to a
folder. Python imports ``sitecustomize`` at start-up, so this runs before the trainer's own code,
in difftune and in any other trainer alike: it registers a global post-step hook on every
``torch.optim.Optimizer`` that appends one JSON line to ``<folder>/<pid>.jsonl`` after each
optimizer step: the wall-clock time (``time.time()``), the peak resident memory so far, and on
CUDA the most memory PyTorch has allocated so far. A line per step, written at once, survives a
process that ends with ``os._exit`` (multi-process difftune runs do). Processes that never step
an optimizer (the launcher, data-loader workers) write nothing, and without the variable
nothing is imported at all.

The hook fires on the wrapped optimizer's own ``step``, so steps that gradient accumulation
skips are not counted, and both trainers are timed at the same point of their loops.

Every record also holds the process's CPU seconds (user + system) and minor page faults so
far, from ``getrusage``: a step's share of them depends on the allocator's settings and much less
on what else the machine runs than its wall-clock time does.

With ``DIFFTUNE_STEP_MEMORY=1`` (bench/memory_accuracy.py, bench/gpu_check.py) each record also
holds the peak memory of the interval since the previous optimizer step, one whole step of
forward, backward and update, with the peaks reset at each step:

- ``step_peak_rss_bytes`` on the CPU: the process's peak resident set in the interval, as the
  kernel counts it (the high-water mark, reset at each step through ``/proc/self/clear_refs``):
  what the user's process holds, the interpreter, its libraries and the allocator's free but
  kept memory included.
- ``step_peak_bytes`` on the CPU: the largest amount of tensor memory alive in the interval:
  the tensors alive at the reset (every tensor object, parameters' gradients included, each
  storage once) plus how far the resident set rose above where it was. That is exact only when
  freed tensors leave the resident set at once, which glibc does when large blocks are mapped
  on their own (``MALLOC_MMAP_THRESHOLD_``, set by ``bench/memory_accuracy.py --tensors``).
- ``cuda_step_peak_allocated_bytes`` / ``cuda_step_peak_reserved_bytes`` on CUDA: PyTorch's own
  peaks of allocated and reserved (cached) memory, reset at each step, and
  ``cuda_context_bytes``: what the device has in use beyond PyTorch's reserved memory (the CUDA
  context and the libraries' own allocations; exact when the process has the GPU to itself).
"""

import os

_FOLDER = os.environ.get("DIFFTUNE_STEP_TIMER")
_STEP_MEMORY = os.environ.get("DIFFTUNE_STEP_MEMORY") == "1"


def _status_bytes(field: str) -> int:
    with open("/proc/self/status", encoding="ascii") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024  # kB
    raise RuntimeError(f"/proc/self/status has no {field}")


def _live_tensor_bytes(torch) -> int:
    """Bytes of every storage that a tensor object (or a parameter's gradient) holds now, on
    the CPU, each storage once."""
    import gc
    import warnings

    storages = {}
    with warnings.catch_warnings():  # isinstance on deprecated module attributes warns
        warnings.simplefilter("ignore")
        objects = [obj for obj in gc.get_objects() if isinstance(obj, torch.Tensor)]
    for obj in objects:
        tensors = [obj]
        if isinstance(obj, torch.nn.Parameter) and obj.grad is not None:
            tensors.append(obj.grad)
        for tensor in tensors:
            if tensor.device.type != "cpu" or tensor.is_sparse:
                continue
            try:
                storage = tensor.untyped_storage()
            except (RuntimeError, NotImplementedError):  # a tensor without storage
                continue
            storages[storage.data_ptr()] = storage.nbytes()
    return sum(storages.values())


def _install() -> None:
    import json
    import resource
    import time

    import torch
    from torch.optim.optimizer import register_optimizer_step_post_hook

    path = os.path.join(_FOLDER, f"{os.getpid()}.jsonl")
    rank = int(os.environ.get("RANK", "0"))
    out = []
    mark = {}  # the CPU's live tensor bytes and resident set at the last reset
    rss_peaks = [0]  # the run's peak resident set: the resets start the kernel's mark again

    def step_memory(record: dict, cuda: bool) -> None:
        if cuda:
            if mark:
                record["cuda_step_peak_allocated_bytes"] = torch.cuda.max_memory_allocated()
                record["cuda_step_peak_reserved_bytes"] = torch.cuda.max_memory_reserved()
                free, total = torch.cuda.mem_get_info()
                record["cuda_context_bytes"] = total - free - torch.cuda.memory_reserved()
            torch.cuda.reset_peak_memory_stats()
            mark["set"] = True  # a reset happened: the next step's peaks are its own
            return
        if mark.get("unavailable"):
            return
        try:
            if mark:
                peak = _status_bytes("VmHWM")
                record["step_peak_rss_bytes"] = peak
                record["step_peak_bytes"] = mark["live"] + max(peak - mark["rss"], 0)
            mark["live"] = _live_tensor_bytes(torch)
            mark["rss"] = _status_bytes("VmRSS")
            with open("/proc/self/clear_refs", "w", encoding="ascii") as refs:
                refs.write("5")  # the high-water mark starts again from the resident set now
        except (OSError, RuntimeError):  # not Linux, or /proc is read-only here: no CPU peaks
            mark.clear()
            mark["unavailable"] = True

    def after_step(optimizer, args, kwargs):
        cuda = torch.cuda.is_available() and torch.cuda.is_initialized()
        if cuda:  # CUDA queues work: a step is done when its kernels are, not when queued
            torch.cuda.synchronize()
        now = time.time()
        usage = resource.getrusage(resource.RUSAGE_SELF)
        if not out:
            out.append(open(path, "a", encoding="utf-8"))  # noqa: SIM115 (open for the process)
        record = {
            "time": now,
            "rank": rank,
            # Linux reports ru_maxrss in KiB
            "peak_rss_bytes": max(rss_peaks[0], usage.ru_maxrss * 1024),
            "cpu_seconds": usage.ru_utime + usage.ru_stime,
            "minor_faults": usage.ru_minflt,
            "cuda_max_allocated_bytes": torch.cuda.max_memory_allocated() if cuda else None,
        }
        rss_peaks[0] = record["peak_rss_bytes"]
        if _STEP_MEMORY:
            step_memory(record, cuda)
        out[0].write(json.dumps(record) + "\n")
        out[0].flush()

    register_optimizer_step_post_hook(after_step)


if _FOLDER:
    _install()
