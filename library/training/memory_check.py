"""The plan's memory line and the check before training: the device's memory, the estimate
(library/training/memory_estimate.py) set against it, and the error with its remedies when a
run cannot fit."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import torch

from library.config.schema import Config
from library.data.plan import DataStats
from library.errors import ConfigError
from library.training.memory_estimate import MemoryEstimate, estimate_peak_memory
from library.training.setup import TrainedParts

GIB = 1024**3
MIB = 1024**2


def system_memory() -> tuple[int, int] | None:
    """(total, available) bytes of system memory, or None where it cannot be read."""
    try:
        text = Path("/proc/meminfo").read_text(encoding="ascii")
    except OSError:
        return _psutil_memory()
    fields = {}
    for line in text.splitlines():
        name, _, rest = line.partition(":")
        parts = rest.split()
        if parts:
            fields[name] = int(parts[0]) * 1024  # kB
    if "MemTotal" not in fields:
        return _psutil_memory()
    return fields["MemTotal"], fields.get("MemAvailable", fields["MemTotal"])


def _psutil_memory() -> tuple[int, int] | None:
    try:  # installed with accelerate
        import psutil
    except ImportError:
        return None
    memory = psutil.virtual_memory()
    return memory.total, memory.available


def device_memory(device: torch.device) -> tuple[int, int] | None:
    """(total, free) bytes of ``device``, or None where unknown."""
    if device.type == "cuda":
        free, total = torch.cuda.mem_get_info(device)
        return total, free
    if device.type == "cpu":
        return system_memory()
    return None


def show_bytes(n: int) -> str:
    """Bytes in GiB with one decimal, or in MiB below 1 GiB."""
    return f"{n / GIB:.1f} GiB" if n >= GIB else f"{math.ceil(n / MIB)} MiB"


def estimate_line(estimate: MemoryEstimate, device: torch.device, memory) -> str:
    """The plan's memory line."""
    s = estimate.size
    frames = f" ({s.frames} frames)" if s.frames > 1 else ""
    checkpointing = " with gradient checkpointing" if estimate.checkpointing else ""
    if estimate.offloaded:
        checkpointing += ", block inputs in host memory"
    line = (
        f"  memory: about {show_bytes(estimate.total)} peak on {device} (weights "
        f"{show_bytes(estimate.weights)}, gradients + optimizer "
        f"{show_bytes(estimate.trained_state)}, activations {show_bytes(estimate.activations)} "
        f"at {s.width}x{s.height}{frames} x {s.batch}{checkpointing}, {_own_name(device)} "
        f"{show_bytes(estimate.process)})"
    )
    if estimate.encoding > estimate.step:
        line += f"; the peak is the VAE encoding images ({show_bytes(estimate.encoding)})"
    if memory is None:
        return line + "; the device's memory is unknown"
    total, free = memory
    return line + f"; the device has {show_bytes(total)} ({show_bytes(free)} free now)"


def _own_name(device: torch.device) -> str:
    """What the process's own memory on ``device`` is, for the plan's line."""
    if device.type == "cpu":
        return "interpreter + allocator"
    return "CUDA context" if device.type == "cuda" else "process"


def _remedies(config: Config) -> str:
    fixes = ["lower train_batch_size or resolution"]
    if not config.training.gradient_checkpointing:
        fixes.append("turn on gradient_checkpointing")
    elif not config.training.cpu_offload_checkpointing:
        fixes.append("turn on cpu_offload_checkpointing")
    if not config.data.cache_latents:
        fixes.append("cache_latents")
    if config.training.fsdp != "full_shard":
        fixes.append('with several GPUs, fsdp = "full_shard"')
    return ", ".join(fixes) + ", or set ignore_memory_estimate = true to try anyway"


@dataclass(frozen=True)
class MemoryCheck:
    """What check_peak_memory found: the plan's line, the estimate (None when the meta forward
    pass failed) and the device's (total, free) bytes (None when unknown)."""

    line: str
    estimate: MemoryEstimate | None = None
    device_memory: tuple[int, int] | None = None

    def report(self) -> dict | None:
        """The estimate for ``--dry_run --json`` (bytes), or None when there is none."""
        e = self.estimate
        if e is None:
            return None
        total, free = self.device_memory or (None, None)
        return {
            "peak_bytes": e.total,
            "weights_bytes": e.weights,
            "trained_state_bytes": e.trained_state,
            "activations_bytes": e.activations,
            "optimizer_update_bytes": e.update,
            "vae_encoding_bytes": e.encoding,
            "process_bytes": e.process,
            "at": {
                "width": e.size.width,
                "height": e.size.height,
                "batch": e.size.batch,
                "frames": e.size.frames,
            },
            "gradient_checkpointing": e.checkpointing,
            "device_total_bytes": total,
            "device_free_bytes": free,
        }


def check_peak_memory(
    config: Config, parts: TrainedParts, stats: DataStats, accelerator, draws_samples: bool
) -> MemoryCheck:
    """Estimate the peak memory on the accelerator's device, for the plan's memory line.

    Raises ConfigError when the estimate exceeds the device's total memory, or when the model
    cannot run the run's shapes, unless ignore_memory_estimate is set. ``draws_samples``: sample
    images are made during training.
    """
    device = accelerator.device
    try:
        estimate = estimate_peak_memory(
            config, parts, stats, accelerator.num_processes, draws_samples, device.type
        )
    except (RuntimeError, NotImplementedError, TypeError, ValueError) as exc:
        return MemoryCheck(_not_estimated(config, exc))
    memory = device_memory(device)
    line = estimate_line(estimate, device, memory)
    if memory is not None and estimate.total > memory[1]:
        line += _over_line(config, estimate, device, memory)
    return MemoryCheck(line, estimate, memory)


def _not_estimated(config: Config, exc: Exception) -> str:
    """The plan's memory line when the meta-device forward pass failed; ConfigError when it
    failed on the run's shapes (unless ignore_memory_estimate), since the first step would too.

    An operation with no meta-device form (NotImplementedError, or an error that names the meta
    device) is the estimate's own limit, not the run's: the line says so and the run goes on.
    """
    reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    if isinstance(exc, NotImplementedError) or "meta" in reason.lower():
        return f"  memory: not estimated (this model cannot run on the meta device: {reason})"
    if not config.training.ignore_memory_estimate:
        raise ConfigError(
            f"the model cannot run this run's shapes ({reason}): the memory estimate's forward "
            "pass on them failed, and training would stop at its first step; check the sizes it "
            "is given (resolution, bucket_reso_steps, control_resolution), or set "
            "ignore_memory_estimate = true to go on without an estimate"
        ) from exc
    return (
        f"  memory: not estimated (the forward pass on this run's shapes failed: {reason}; "
        "going on as ignore_memory_estimate = true asks)"
    )


def _over_line(config: Config, estimate: MemoryEstimate, device, memory: tuple[int, int]) -> str:
    """The warning added to the line when the estimate is above what is free (ConfigError when
    it is above the device's total, unless ignore_memory_estimate)."""
    total = memory[0]
    if estimate.total > total:
        exceeds = (
            f"estimated peak memory {show_bytes(estimate.total)} exceeds the {show_bytes(total)} "
            f"of {device}"
        )
        if not config.training.ignore_memory_estimate:
            raise ConfigError(f"{exceeds}; {_remedies(config)}")
        return f"\nwarning: {exceeds}; trying anyway (ignore_memory_estimate = true)"
    return f"\nwarning: the estimate is more than the {show_bytes(memory[1])} free on {device} now"
