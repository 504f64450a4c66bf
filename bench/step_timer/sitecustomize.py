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
"""

import os

_FOLDER = os.environ.get("DIFFTUNE_STEP_TIMER")


def _install() -> None:
    import json
    import resource
    import time

    import torch
    from torch.optim.optimizer import register_optimizer_step_post_hook

    path = os.path.join(_FOLDER, f"{os.getpid()}.jsonl")
    rank = int(os.environ.get("RANK", "0"))
    out = []

    def after_step(optimizer, args, kwargs):
        cuda = torch.cuda.is_available() and torch.cuda.is_initialized()
        if cuda:  # CUDA queues work: a step is done when its kernels are, not when queued
            torch.cuda.synchronize()
        now = time.time()
        if not out:
            out.append(open(path, "a", encoding="utf-8"))  # noqa: SIM115 (open for the process)
        record = {
            "time": now,
            "rank": rank,
            # Linux reports ru_maxrss in KiB
            "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
            "cuda_max_allocated_bytes": torch.cuda.max_memory_allocated() if cuda else None,
        }
        out[0].write(json.dumps(record) + "\n")
        out[0].flush()

    register_optimizer_step_post_hook(after_step)


if _FOLDER:
    _install()
