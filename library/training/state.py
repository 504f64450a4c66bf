"""Resumable training state: trained weights, optimizer, schedule and progress, in one folder.

Only what training changes is stored (for a LoRA run, the adapter weights, not the frozen base
model). No random-number state is needed: every random draw is keyed by (seed, epoch, position),
so the step counter alone fixes the data position and the noise that follows.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from library.errors import CheckpointError
from library.saving.atomic import atomic_write_dir

STATE_VERSION = 1
_WEIGHTS, _OPTIMIZER, _SCHEDULER, _SCALER, _EMA, _PROGRESS = (
    "trained.safetensors",
    "optimizer.pt",
    "scheduler.pt",
    "scaler.pt",
    "ema.pt",
    "progress.json",
)


@dataclass(frozen=True)
class Progress:
    """Where the run stands, plus what must match for a resume to continue the same run."""

    global_step: int
    seed: int
    train_mode: str
    steps_per_epoch: int
    effective_batch_sizes: list[int]
    world_size: int
    version: int = STATE_VERSION
    run_id: str | None = None  # the run this state belongs to (None: saved by an older difftune)
    # settings changed at resumes, oldest first: {"step": N, "changes": {key: [was, now]}}
    resume_changes: list = field(default_factory=list)


@dataclass
class LoadedState:
    weights: dict[str, torch.Tensor]
    optimizer: dict
    scheduler: dict
    scaler: dict | None
    progress: Progress
    ema: dict | None = None


def save_state(
    path: Path,
    weights: dict[str, torch.Tensor],
    optimizer_state: dict,
    scheduler,
    scaler,
    progress: Progress,
    ema: dict | None = None,
    extra: Callable[[Path], None] | None = None,
) -> None:
    """Write the state folder atomically: a reader never sees a half-written state.

    ``optimizer_state`` is the optimizer's state_dict (whole tensors: see sharding).
    ``extra(tmp)`` may add files (e.g. the run's settings) to the folder before it is renamed.
    """

    def write(tmp: Path) -> None:
        if extra is not None:
            extra(tmp)
        save_file({k: v.detach().contiguous().cpu() for k, v in weights.items()}, tmp / _WEIGHTS)
        torch.save(optimizer_state, tmp / _OPTIMIZER)
        torch.save(scheduler.state_dict(), tmp / _SCHEDULER)
        if scaler is not None:
            torch.save(scaler.state_dict(), tmp / _SCALER)
        if ema is not None:
            torch.save(ema, tmp / _EMA)
        (tmp / _PROGRESS).write_text(json.dumps(asdict(progress), indent=2), encoding="utf-8")

    atomic_write_dir(path, write)


def load_state(path: str | Path) -> LoadedState:
    """Read a state folder; any missing or damaged part is a CheckpointError naming it."""
    path = Path(path)
    if not path.is_dir():
        raise CheckpointError(f"resume: {path} is not a state folder; give a *-state folder saved by save_state")
    try:
        progress = Progress(**json.loads((path / _PROGRESS).read_text(encoding="utf-8")))
        if type(progress.global_step) is not int or progress.global_step < 0:
            raise ValueError(f"global_step {progress.global_step!r} is not a step count")
        weights = load_file(path / _WEIGHTS)
        # weights_only: a state folder never needs pickled code, so none is ever run
        optimizer = torch.load(path / _OPTIMIZER, map_location="cpu", weights_only=True)
        scheduler = torch.load(path / _SCHEDULER, map_location="cpu", weights_only=True)
        scaler = _load_optional(path / _SCALER)
        ema = _load_optional(path / _EMA)
    except FileNotFoundError as exc:
        raise CheckpointError(f"resume: {path} is incomplete ({Path(exc.filename).name} missing)") from exc
    except Exception as exc:  # corrupt JSON, safetensors or torch file
        raise CheckpointError(f"resume: {path} is damaged ({type(exc).__name__}: {exc})") from exc
    if progress.version != STATE_VERSION:
        raise CheckpointError(f"resume: {path} has state version {progress.version}; this difftune reads {STATE_VERSION}")
    return LoadedState(weights, optimizer, scheduler, scaler, progress, ema)


def _load_optional(file: Path) -> dict | None:
    return torch.load(file, map_location="cpu", weights_only=True) if file.exists() else None


def check_compatible(saved: Progress, current: Progress, path: Path) -> None:
    """Refuse a resume that would not continue the same run. Another number of steps per epoch
    is not refused: the images changed (one that broke was removed, new ones were added), and
    the run goes on from its step with the epochs of the new data (resume_rules)."""
    for name in ("seed", "train_mode", "effective_batch_sizes"):
        was, now = getattr(saved, name), getattr(current, name)
        if was != now:
            hint = {
                "effective_batch_sizes": " (batch size x accumulation x processes must stay the "
                "same; with another process count, change gradient_accumulation_steps to match)",
            }.get(name, "")
            raise CheckpointError(f"resume: {path} was saved with {name} = {was}, this run has {now}{hint}")
