"""The run summary: ``<output_dir>/<output_name>-summary.json``, what a batch script reads.

It is written by the main process alone, atomically (library/saving/atomic.py), while the run
holds its output name's lock: with status "running" as soon as the lock is taken (and again
about once a minute while training), then replaced by "finished", "failed" or "stopped" when
the run ends in any way Python sees (an error, Ctrl-C, SIGTERM at a step boundary). A run the OS
kills (kill -9, out of memory, power loss) leaves "running": a summary that says "running"
while its process (``pid`` on ``host``) is gone means the run did not end normally.

Runs refused before they take the lock (config errors, a second run of a taken name) and dry
runs write none: the name may belong to another run, whose record must stay as it is. The exit
code alone tells those apart (docs/batch-runs.md).

Only the main process writes, and nothing here is a collective: every process already ends
with the same code (stops, non-finite losses and failed saves are agreed on at the step's
collective or the saver's), so the summary cannot disagree with the other processes. Failing to
write it never changes the run's outcome: one warning is printed and the run goes on.
"""

from __future__ import annotations

import json
import math
import os
import re
import socket
import sys
import time
from collections.abc import Iterable
from datetime import datetime
from pathlib import Path

import torch

from library import __version__
from library.errors import exit_code_of, exit_reason_of
from library.sampling.grid import sample_dir
from library.saving.atomic import atomic_write_file
from library.saving.outputs import OutputLayout, output_run_id
from library.training.stops import TrainingStopped

SUMMARY_VERSION = 1  # raised when a field changes meaning or goes away; new fields keep it
REFRESH_SECONDS = 60.0  # a running summary is rewritten at most this often, at step boundaries


def peak_resident_bytes() -> int | None:
    """The process's peak resident set, where the OS reports it."""
    try:
        import resource
    except ImportError:  # Windows
        return None
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024  # bytes on macOS, KiB on Linux


def _iso(seconds: float) -> str:
    return datetime.fromtimestamp(seconds).astimezone().isoformat(timespec="seconds")


def _finite(value: float | None) -> float | None:
    return value if value is not None and math.isfinite(value) else None


def status_of(exc: BaseException | None) -> str:
    """The status of a run that ended with ``exc``: finished (None), stopped (a signal, or
    Ctrl-C as KeyboardInterrupt) or failed."""
    if exc is None:
        return "finished"
    return "stopped" if isinstance(exc, (TrainingStopped, KeyboardInterrupt)) else "failed"


class RunSummary:
    """Keeps what the summary says and writes it; made once the output name is locked.

    Use it as a context manager around training (``__enter__`` writes "running", ``__exit__``
    the outcome) and call ``step`` once per optimizer step on every process."""

    def __init__(self, config, plan, accelerator, start, config_files: Iterable[str] = ()):
        self.config, self.plan = config, plan
        self.writes = accelerator.is_main_process
        self.layout = OutputLayout(config.saving)
        self.path = self.layout.summary
        self.run_id = start.run_id
        self.resumed_at = start.resume.global_step if start.resume is not None else None
        self.steps_done = self.resumed_at or 0
        self.last_loss: float | None = None
        self.last_loss_step: int | None = None
        self.last_epoch_loss: float | None = None
        self._epoch_losses: list[float] = []
        files = [*config_files]
        if config.data.dataset_config:
            files.append(config.data.dataset_config)
        self.config_files = [str(Path(f).absolute()) for f in files]
        self.started = time.time()
        self.device = accelerator.device
        self.memory_estimate: dict | None = None  # the plan's, once the models are loaded
        self._written_at = -math.inf  # time.monotonic() of the last write
        self._warned = False

    def __enter__(self) -> RunSummary:
        self.write("running")
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        self.write(status_of(exc), exc)
        return False  # the exception goes on to the CLI, which prints it and exits with its code

    def step(self, global_step: int, loss: float, applied: bool) -> None:
        """After optimizer step ``global_step`` and its log line; ``applied`` False: a step
        dropped for a non-finite loss. The epoch mean is the progress reporter's "loss/epoch"."""
        self.steps_done = global_step
        if applied:
            self.last_loss, self.last_loss_step = _finite(loss), global_step
            self._epoch_losses.append(loss)
        if global_step % self.plan.steps_per_epoch == 0 and self._epoch_losses:
            self.last_epoch_loss = _finite(sum(self._epoch_losses) / len(self._epoch_losses))
            self._epoch_losses.clear()
        if time.monotonic() - self._written_at >= REFRESH_SECONDS:
            self.write("running")

    def write(self, status: str, exc: BaseException | None = None) -> None:
        """Replace the summary file (main process only); a failure is a warning, nothing more."""
        if not self.writes:
            return
        self._written_at = time.monotonic()
        try:
            text = json.dumps(self.fields(status, exc), indent=2, allow_nan=False) + "\n"
            atomic_write_file(self.path, lambda tmp: tmp.write_text(text, encoding="utf-8"))
        except Exception as failed:  # the summary is a record: it must not end a run
            if not self._warned:
                self._warned = True
                reason = exit_reason_of(failed)
                print(
                    f"warning: the run summary {self.path} was not written ({reason})",
                    file=sys.stderr,
                )

    def fields(self, status: str, exc: BaseException | None = None) -> dict:
        """Everything the summary says, as JSON-ready values (docs/batch-runs.md)."""
        now, plan, saving = time.time(), self.plan, self.config.saving
        outputs = self.outputs()
        states = [o for o in outputs if o["kind"] == "state" and o.get("step") is not None]
        latest = max(states, key=lambda o: o["step"])["path"] if states else None
        ended = status != "running"
        return {
            "summary_version": SUMMARY_VERSION,
            "difftune_version": __version__,
            "status": status,
            "exit_code": exit_code_of(exc) if ended else None,
            "exit_reason": exit_reason_of(exc),
            "started_at": _iso(self.started),
            "finished_at": _iso(now) if ended else None,
            "seconds": round(now - self.started, 1),
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "config_files": self.config_files,
            "output_dir": str(Path(saving.output_dir).absolute()),
            "output_name": saving.output_name,
            "run_id": self.run_id,
            "world_size": plan.world_size,
            "steps_done": self.steps_done,
            "total_steps": plan.total_steps,
            "steps_this_run": self.steps_done - (self.resumed_at or 0),
            "epoch": plan.epoch_of_step(max(self.steps_done - 1, 0)) + 1 if self.steps_done else 0,
            "epochs": plan.epochs,
            "last_loss": self.last_loss,
            "last_loss_step": self.last_loss_step,
            "last_epoch_loss": self.last_epoch_loss,
            "resumed_from": (
                {"state": str(Path(saving.resume).absolute()), "step": self.resumed_at}
                if saving.resume
                else None
            ),
            "resume_with": latest,
            "outputs": outputs,
            "samples": self.samples(),
            "memory": self.memory(),
        }

    def memory(self) -> dict:
        """The plan's memory estimate beside what this process has used so far: PyTorch's
        peak allocated and reserved memory on a CUDA device, the peak resident set on the
        host (the CPU's, when training on it; the interpreter and libraries included)."""
        estimate = self.memory_estimate or {}
        allocated = reserved = None
        if self.device.type == "cuda" and torch.cuda.is_initialized():
            allocated = torch.cuda.max_memory_allocated(self.device)
            reserved = torch.cuda.max_memory_reserved(self.device)
        return {
            "estimated_peak_bytes": estimate.get("peak_bytes"),
            "peak_allocated_bytes": allocated,
            "peak_reserved_bytes": reserved,
            "peak_resident_bytes": peak_resident_bytes(),
        }

    def outputs(self) -> list[dict]:
        """This run's outputs on disk now (earlier parts of a resumed run included; files of
        another run that --overwrite has not replaced yet left out), by name."""
        return [
            self.layout.describe(path)
            for path in self.layout.existing_outputs()
            if output_run_id(path) == self.run_id
        ]

    def samples(self) -> dict | None:
        """The sample images folder and how many images of this output name it holds."""
        if not self.config.sampling.sample_prompts:
            return None
        folder = sample_dir(self.config.saving.output_dir)
        pattern = re.compile(re.escape(self.layout.name) + r"_\d{6}_(\d{2}_\d+|grid)\.png")
        count = (
            sum(1 for p in folder.iterdir() if pattern.fullmatch(p.name)) if folder.is_dir() else 0
        )
        return {"folder": str(folder.absolute()), "images": count}
